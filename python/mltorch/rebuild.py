"""Model files are data: the module of an ML-TORCH model file rebuilt for
compiling or importing again, from the classes of ML-TORCH's own package
only (an allow-list: a file whose metadata names anything else is refused),
or from an explicitly named source file (mltorch-compile --source)."""

import importlib
import os
import sys

import torch

from .export import DTYPES, OWN_PACKAGE, ExportError, read_metadata

def architecture_class(name, label="the model file"):
    """The class that a model file's metadata names (`architecture.class`), if it
    is one of ML-TORCH's own: a public torch.nn.Module subclass defined in a
    module under `mltorch.` (mltorch.models, mltorch.analytic, mltorch.layered,
    mltorch.importers.*). Anything else (os.system, subprocess.Popen, a class of
    another package) is refused with an ExportError (a ValueError) before its
    module is imported or anything is called: a model file is data, not code."""
    def refused(why):
        return ExportError(
            f"{label}: its metadata names the architecture class {name!r}, which {why}: a model "
            f"file may only name ML-TORCH's own classes (torch.nn.Module subclasses defined in the "
            f"{OWN_PACKAGE} package, such as {OWN_PACKAGE}.models.LocalMBNet); it was not called")
    if not isinstance(name, str):
        raise refused("is not a class path")
    module_name, _, cls_name = name.rpartition(".")
    parts = module_name.split(".")
    if parts[0] != OWN_PACKAGE or len(parts) < 2 or not all(q.isidentifier() for q in parts):
        raise refused(f"is not in a module of the {OWN_PACKAGE} package")
    if not cls_name.isidentifier() or cls_name.startswith("_"):
        raise refused("is not a public class name")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ExportError(f"{label}: cannot import the architecture {name}: {e}")
    cls = getattr(module, cls_name, None)
    if cls is None:
        raise ExportError(f"{label}: cannot import the architecture {name}: "
                          f"{module_name} has no {cls_name}")
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        raise refused("is not a torch.nn.Module class")
    if not cls.__module__.startswith(OWN_PACKAGE + "."):
        raise refused(f"is defined in {cls.__module__}, not in the {OWN_PACKAGE} package")
    return cls


def rebuild(path, source=None, label=None):
    """The eager module of a model file, from its recorded architecture and parameters.

    The class must be ML-TORCH's own (architecture_class). An importer's class
    (mltorch.importers.*) is rebuilt from the framework file the model was
    imported from, which the framework's loader unpickles (torch.load with
    weights_only=False): that file runs whatever code it holds. `source` (what
    the user names, mltorch-compile --source) replaces the path recorded in
    the metadata; without it the recorded path is used and a note on stderr
    says so before it is loaded. `label` names the file in messages."""
    label = label or path
    meta = read_metadata(path)
    arch = meta.get("architecture")
    if not isinstance(arch, dict) or "class" not in arch:
        raise ExportError(
            f"{label} does not record its architecture (metadata 'architecture'), so its eager "
            "module cannot be rebuilt: export it with mltorch.export(..., architecture=kwargs), or "
            "call mltorch.compiled.compile_model() with the eager module")
    cls = architecture_class(arch["class"], label)
    kwargs = arch.get("kwargs", {})
    if not isinstance(kwargs, dict):
        raise ExportError(f"{label}: its metadata's architecture.kwargs is not a JSON object")
    kwargs = dict(kwargs)
    key = getattr(cls, "SOURCE_ARGUMENT", None)    # the framework file an importer unpickles
    if source is not None:
        if key is None:
            raise ExportError(f"--source {source}: {label} ({arch['class']}) is not an imported "
                              "model, it is rebuilt from no framework file")
        kwargs[key] = os.path.abspath(source) if os.path.exists(source) else source
    elif key is not None and kwargs.get(key) is not None \
            and kwargs[key] not in getattr(cls, "INSTALLED_SOURCES", ()):
        print(f"mltorch: note: {label} was imported from {kwargs[key]!r} (recorded in its "
              f"metadata, architecture.kwargs.{key}); rebuilding {arch['class']} loads that file "
              "with the framework's own loader, which unpickles it (torch.load with "
              "weights_only=False) and so runs any code it holds. Compile only model files "
              "whose source you trust, or name the source yourself "
              "(mltorch-compile --source FILE).",
              file=sys.stderr, flush=True)
    # in the file's dtype before the parameters are loaded: load_state_dict
    # copies into the existing tensors, and float32 ones would round them
    module = cls(**kwargs).to(DTYPES[meta["dtype"]])
    scripted = torch.jit.load(path, map_location="cpu")
    try:
        module.load_state_dict(scripted.state_dict())
    except RuntimeError as e:
        raise ExportError(f"{label}: its parameters do not fit {arch['class']}"
                          f"({kwargs}): {str(e).splitlines()[0]}")
    return module.to(DTYPES[meta["dtype"]]).eval(), meta
