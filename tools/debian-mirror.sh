# Sourced by the tools that make Debian roots (debian13-root.sh, slurm-local.sh).
# the Debian mirror the host's apt already uses (no mirror host is written here)
host_debian_uri() {
  local uri
  uri=$(grep -h -m1 -E '^URIs:.*debian' /etc/apt/sources.list.d/*.sources 2>/dev/null \
          | grep -v security | awk '{print $2}' | head -n1 || true)
  [ -n "$uri" ] || uri=$(grep -h -E '^deb .*debian' /etc/apt/sources.list 2>/dev/null \
                           | grep -v security | awk '{print $2}' | head -n1 || true)
  [ -n "$uri" ] || { echo "ERROR: no Debian apt source on this host to take the mirror from" >&2; exit 1; }
  echo "$uri"
}
