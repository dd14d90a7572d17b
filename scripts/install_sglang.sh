#!/usr/bin/env bash
# Install one sglang release for kvcheck's `sglang` target, beside an existing torch.
#
# sglang's own dependency list pins a CUDA torch and GPU kernel packages, so it is
# installed with --no-deps, plus exactly the packages that its pool, configurator and
# server-argument code import. torch is held at the installed build by a constraint, so
# nothing here can replace a CPU torch with a CUDA one. torchvision is deliberately
# absent: kvcheck's adapter supplies a stand-in while sglang is imported.
#
# Usage:  bash scripts/install_sglang.sh            (idempotent; its last line says what
#                                                    was installed and how to run the target)
#         KVCHECK_SGLANG_VERSION=0.5.22 bash scripts/install_sglang.sh
#         bash scripts/install_sglang.sh --releases   (prints the known releases, oldest
#                                                      first, one a line; installs nothing)
# Env:    KVCHECK_SGLANG_VERSION  the release (default: the newest known)
#         KVCHECK_TORCH_PIN       torch release sglang must sit beside (default 2.13.0)
#         PYTHON                  interpreter whose environment receives the packages
# One environment holds one release: installing another replaces sglang (the pins below
# are shared). For several releases side by side, make one environment each
# (docs/sglang-releases.md).
set -euo pipefail

die() { echo "install_sglang: $*" >&2; exit 1; }

# The releases kvcheck's target is checked against, oldest first; the last is the default.
# The one list is kvcheck/targets/sglang/releases.txt (KNOWN_RELEASES in release.py reads
# it too, with the same rules): one release a line, `#` starts a comment, blank lines skip.
RELEASES_FILE="$(dirname "${BASH_SOURCE[0]}")/../kvcheck/targets/sglang/releases.txt"
[ -r "$RELEASES_FILE" ] || die "cannot read the list of known releases, $RELEASES_FILE"
KNOWN_RELEASES=()
while IFS= read -r line || [ -n "$line" ]; do
  line="${line%%#*}"
  read -r line extra <<<"$line" || true  # trims blanks
  [ -z "$extra" ] || die "$RELEASES_FILE: one release a line, not '$line $extra'"
  [ -z "$line" ] || KNOWN_RELEASES+=("$line")
done <"$RELEASES_FILE"
[ "${#KNOWN_RELEASES[@]}" -gt 0 ] || die "$RELEASES_FILE lists no release"

if [ "${1:-}" = "--releases" ]; then
  printf '%s\n' "${KNOWN_RELEASES[@]}"
  exit 0
fi
[ "$#" -eq 0 ] || die "unknown argument $1 (the only one is --releases; the release is KVCHECK_SGLANG_VERSION)"

PYTHON="${PYTHON:-python3}"
TORCH_PIN="${KVCHECK_TORCH_PIN:-2.13.0}"
SGLANG_VERSION="${KVCHECK_SGLANG_VERSION:-${KNOWN_RELEASES[-1]}}"
start=$(date +%s)

case " ${KNOWN_RELEASES[*]} " in
  *" $SGLANG_VERSION "*) ;;
  *) die "sglang $SGLANG_VERSION is not a release this recipe knows; known: ${KNOWN_RELEASES[*]} (set KVCHECK_SGLANG_VERSION to one of them; the list is $RELEASES_FILE)" ;;
esac

# Pins that differ per release, beside the common set below. None do for the known
# releases: the common set imports them all. Each release's own Requires-Dist differs (0.5.21:
# transformers==5.12.1, tokenizers==0.22.2, openai==2.6.1; 0.5.22: openai==2.6.1), but
# 0.5.21's transformers does not import sglang's config package without a real
# torchvision (AutoImageProcessor is a torchvision dummy before transformers 5.19), so the
# common transformers==5.19.0 stays; pip reports the others as conflicts, harmlessly.
# (0.5.20 would need xgrammar==0.2.1 here and is not checked; 0.5.18 imports with no single
# transformers release under this CPU recipe.) A release that needs pins of its own gets a
# row:  case "$SGLANG_VERSION" in 0.5.NN) RELEASE_PINS=(name==version) ;; esac
RELEASE_PINS=()

torch_version() { "$PYTHON" -c 'from importlib.metadata import version; print(version("torch"))'; }

installed_torch=$(torch_version 2>/dev/null) \
  || die "torch is not installed for $PYTHON; install torch==$TORCH_PIN (CPU build) first"
case "$installed_torch" in
  "$TORCH_PIN" | "$TORCH_PIN"+*) ;;
  *) die "found torch $installed_torch but sglang is checked beside torch==$TORCH_PIN (set KVCHECK_TORCH_PIN to override)" ;;
esac

# Direct imports of sglang's pool code (verified with every known release on CPU).
REQUIREMENTS=(
  "sglang==$SGLANG_VERSION"
  ${RELEASE_PINS[@]+"${RELEASE_PINS[@]}"}
  numpy==2.4.6 orjson==3.8.3 psutil==7.2.2 pybase64==1.5.1 requests==2.34.2
  triton==3.9.0 packaging==26.2 pillow==13.0.0 starlette==1.10.0 msgspec==0.23.0
  pydantic==2.13.4 pyzmq==27.3.0 tqdm==4.70.1 ipython==8.12.3 aiohttp==3.14.5
  transformers==5.19.0 tokenizers==0.23.2 dill==0.4.1 apache-tvm-ffi==0.1.11
  sentencepiece==0.2.1 compressed-tensors==0.18.0 gguf==0.19.0 einops==0.8.2
  openai==2.8.0 partial-json-parser==0.2.1.1.post7
)

constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
# torch stays exactly the installed build; the rest pins the transitive set so that
# CI resolves the same environment every time.
cat > "$constraints" <<PINS
torch==$installed_torch
aiohappyeyeballs==2.7.1
aiosignal==1.4.0
annotated-doc==0.0.7
anyio==4.16.0
click==8.5.1
distro==1.9.0
frozenlist==1.8.0
h11==0.16.0
hf-xet==1.8.0
httpcore==1.0.9
httpx==0.28.1
huggingface-hub==1.33.0
jiter==0.19.0
loguru==0.7.3
markdown-it-py==4.3.0
mdurl==0.1.2
multidict==7.2.1
propcache==0.5.4
rich==15.0.0
safetensors==0.8.0
shellingham==1.5.4
typer==0.29.2
typing-extensions==4.16.0
yarl==1.25.1
PINS

already_installed() {
  "$PYTHON" - "${REQUIREMENTS[@]}" <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version

for requirement in sys.argv[1:]:
    name, wanted = requirement.split("==")
    try:
        if version(name) != wanted:
            sys.exit(1)
    except PackageNotFoundError:
        sys.exit(1)
PY
}

# pip, quietly. Its "dependency resolver" block lists every pin of sglang's own (a CUDA
# torch, GPU kernels) that this recipe leaves out on purpose; it is expected, so it becomes
# one line saying so. Anything else pip says is shown; a failing pip shows all of it.
pip_install() {
  local log status=0 conflicts
  log=$(mktemp)
  "$PYTHON" -m pip install -q --disable-pip-version-check "$@" >"$log" 2>&1 || status=$?
  if [ "$status" -ne 0 ]; then
    cat "$log" >&2
    rm -f "$log"
    die "pip install failed (exit $status; its output is above)"
  fi
  conflicts=$(grep -cE "$PIP_CONFLICT" "$log" || true)
  grep -vE "$PIP_CONFLICT|^ERROR: pip's dependency resolver|^\[notice\]|^[[:space:]]*$" "$log" || true
  rm -f "$log"
  if [ "$conflicts" -gt 0 ]; then
    echo "install_sglang: pip lists $conflicts of sglang's own pins as conflicts (a CUDA torch, GPU kernels); expected: the CPU torch is kept on purpose and only what kvcheck imports is installed"
  fi
}
# One line of pip's resolver block: "sglang 0.5.23 requires torch==2.14.1, but you have
# torch 2.13.0+cpu which is incompatible." or "..., which is not installed."
PIP_CONFLICT='^[^ ]+ [^ ]+ requires .+(, but you have .+ which is incompatible|, which is not installed)\.$'

if already_installed; then
  echo "install_sglang: sglang==$SGLANG_VERSION and its pinned imports are already installed"
else
  # sglang alone, without its CUDA-only dependency list.
  pip_install --no-deps -c "$constraints" "sglang==$SGLANG_VERSION"
  # What its pool code imports; the constraint keeps torch as it is.
  pip_install -c "$constraints" "${REQUIREMENTS[@]:1}"
fi

after_torch=$(torch_version)
[ "$after_torch" = "$installed_torch" ] \
  || die "torch changed from $installed_torch to $after_torch; this must not happen"

"$PYTHON" - "${REQUIREMENTS[@]}" $(grep -v '^torch==' "$constraints") <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, distribution

total = 0
for requirement in sys.argv[1:]:
    try:
        files = distribution(requirement.split("==")[0]).files or ()
    except PackageNotFoundError:  # a transitive pin that this resolution did not need
        continue
    total += sum(f.size or 0 for f in files)
print(f"install_sglang: the pinned set occupies {total / 1e9:.2f} GB on disk")
PY
echo "install_sglang: installed sglang $SGLANG_VERSION and its $(( ${#REQUIREMENTS[@]} - 1 )) pinned imports beside torch $after_torch (untouched) in $(( $(date +%s) - start )) s; run the target with: kvcheck verify --target sglang"
