# Sourced by the bench scripts that run this checkout as it is, without `make install` (needs ROOT, the
# repository root, and PY, the interpreter; run from ROOT).
# kernels/ imports as `zerogr_kernels` (pyproject.toml maps it): unless the interpreter already resolves
# that name to this checkout's kernels/, a link of that name on a temporary PYTHONPATH entry does (the
# interpreter's own packages are left alone). Triton kernels compile for the GPU, never interpreted.
if ! $PY -c 'import os, sys, zerogr_kernels as k; sys.exit(os.path.realpath(k.__path__[0]) != os.path.realpath("kernels"))' \
    2>/dev/null; then
  LINKS=$(mktemp -d /tmp/zerogr_path.XXXXXX)
  trap 'rm -rf "$LINKS"' EXIT
  ln -s "$ROOT/kernels" "$LINKS/zerogr_kernels"
  export PYTHONPATH="$LINKS${PYTHONPATH:+:$PYTHONPATH}"
fi
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/zerogr_triton_cache}
unset TRITON_INTERPRET
