# Sourced by scripts/serve.sh and scripts/test.sh (from the checkout's root): make sure the
# project's virtual environment ./.venv exists, holds this checkout (editable) with the extras
# in $1, and comes first on the PATH.
#
# A virtual environment, not the interpreter itself, because a stock Debian/Ubuntu python3 is
# "externally managed" (PEP 668) and refuses pip installs. Quick when nothing changed: a stamp
# per set of extras, made of pyproject.toml's hash and the checkout's path, skips pip.

stations_venv() {
  local extras="$1"
  local root
  root=$(pwd -P)
  if [ ! -x .venv/bin/python ]; then
    if ! python3 -m venv .venv; then
      # Debian/Ubuntu ship the venv module's pip seed separately (python3-venv).
      rm -rf .venv
      if command -v apt-get >/dev/null 2>&1; then
        local sudo=""
        if [ "$(id -u)" -ne 0 ]; then sudo="sudo -n"; fi
        $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv
        python3 -m venv .venv
      else
        echo "stations: python3 -m venv failed; install Python's venv module" >&2
        return 1
      fi
    fi
  fi
  local stamp=".venv/.stations-installed-${extras:-base}"
  local want
  want="$(sha256sum pyproject.toml | cut -d' ' -f1) $root"
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    local spec="."
    if [ -n "$extras" ]; then spec=".[$extras]"; fi
    # The distribution was called `stations` before it became `stations-streams` (that name
    # on PyPI is another project). Uninstalled first: removed after the new install, it would
    # take the `stations` command both provide with it.
    if .venv/bin/python -m pip show -q stations >/dev/null 2>&1; then
      .venv/bin/python -m pip uninstall --disable-pip-version-check -q -y stations
    fi
    .venv/bin/python -m pip install --disable-pip-version-check -q -e "$spec"
    echo "$want" >"$stamp"
  fi
  export VIRTUAL_ENV="$root/.venv"
  export PATH="$VIRTUAL_ENV/bin:$PATH"
}
