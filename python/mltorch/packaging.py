"""The layout of a compiled package (.pt2): the AOTInductor archive, its
TorchScript twin, its description (extra/mltorch_compiled.json) and a
layered model's stage packages; writing and reading it."""

import json
import os
import tempfile
import zipfile

from .export import ExportError

COMPILED_NAME = "mltorch_compiled.json"    # under the archive's extra/ folder
TWIN_NAME = "mltorch/model.pt"              # the TorchScript twin (binary: not under extra/,
                                            # which torch's own loader decodes as text)
COMPILED_FORMAT = 1
STAGE_DIR = "mltorch/stages"                # compiled stages of a layered model (each a package)
GRAPH_PASSES = 1                            # version of the passes run on the traced graph before
                                            # Inductor (1: realize_gather_sources, unroll_small_bmm);
                                            # a package made with older passes is right but slower


def _clear_exec_stack(elf):
    """The shared library with its PT_GNU_STACK segment not executable.

    AOTInductor assembles the model's constants without a .note.GNU-stack
    section, so the linker marks the library as needing an executable stack;
    glibc >= 2.41 (Debian 13) then refuses to dlopen it ("cannot enable
    executable stack").  Nothing in the library runs code on the stack: this
    clears the flag, as `patchelf --clear-execstack` would."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:    # 64-bit little-endian only
        return elf
    out = bytearray(elf)
    phoff = int.from_bytes(elf[0x20:0x28], "little")
    phentsize = int.from_bytes(elf[0x36:0x38], "little")
    phnum = int.from_bytes(elf[0x38:0x3a], "little")
    for k in range(phnum):
        at = phoff + k * phentsize
        if int.from_bytes(elf[at:at + 4], "little") == 0x6474E551:    # PT_GNU_STACK
            flags = int.from_bytes(elf[at + 4:at + 8], "little") & ~0x1    # no PF_X
            out[at + 4:at + 8] = flags.to_bytes(4, "little")
    return bytes(out)


def write_package(raw, out_path, twin, info, stage_files=None):
    """Copy the AOTInductor archive and add the twin, the stage packages of a
    layered model (each an AOTInductor package of its own, stored whole) and
    the info, atomically."""
    directory = os.path.dirname(os.path.abspath(out_path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".pt2", dir=directory)
    os.close(fd)
    try:
        with zipfile.ZipFile(raw) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as dst:
            names = src.namelist()
            root = names[0].split("/", 1)[0]
            for name in names:
                with src.open(name) as fh:
                    data = fh.read()
                if name.endswith(".so"):
                    data = _clear_exec_stack(data)
                dst.writestr(src.getinfo(name), data)
            dst.writestr(f"{root}/{TWIN_NAME}", twin)
            for name, path in (stage_files or {}).items():
                with zipfile.ZipFile(path) as stage_zip, tempfile.TemporaryDirectory() as sd:
                    # the stage's shared library gets the same stack fix
                    fixed = os.path.join(sd, "stage.pt2")
                    with zipfile.ZipFile(fixed, "w", zipfile.ZIP_STORED) as out:
                        for item in stage_zip.namelist():
                            data = stage_zip.read(item)
                            if item.endswith(".so"):
                                data = _clear_exec_stack(data)
                            out.writestr(stage_zip.getinfo(item), data)
                    with open(fixed, "rb") as fh:
                        dst.writestr(f"{root}/{STAGE_DIR}/{name}.pt2", fh.read())
            dst.writestr(f"{root}/extra/{COMPILED_NAME}", json.dumps(info, indent=1, sort_keys=True))
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, out_path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def read_package(path):
    """(twin TorchScript bytes, compiled info dict) of a package; ExportError if it is none."""
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
            root = names[0].split("/", 1)[0] if names else ""
            return (z.read(f"{root}/{TWIN_NAME}"),
                    json.loads(z.read(f"{root}/extra/{COMPILED_NAME}")))
    except (zipfile.BadZipFile, KeyError, IndexError) as e:
        raise ExportError(f"{path} is not an ML-TORCH compiled package: {e}")


def try_read_package(path):
    """read_package() for a compiled package; (None, None) for any other file (a
    TorchScript archive is a zip file too)."""
    if not zipfile.is_zipfile(path):
        return None, None
    try:
        return read_package(path)
    except ExportError:
        return None, None
