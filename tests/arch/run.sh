#!/bin/bash
# The engine's tests on another architecture than this machine's (`make test-arch ARCH=arm64`,
# ARCH=s390x), under QEMU user-mode emulation, as a user of that architecture would install
# flannel-udp on Debian 12.
#
#   tests/arch/run.sh ARCH [STEP...]      STEP: root install build test bpf cross (the default,
#                                         in this order; bpf and cross on arm64 only)
#
#   host     only the packages this machine needs (qemu-user-static, binfmt-support, debootstrap);
#            the root step installs them too: this lets a caller (.ci/run) take apt's lock before
#            it starts other work beside the emulated steps
#   root     a Debian 12 root of ARCH in $FLANNEL_UDP_ARCH_DIR/ARCH (default
#            /var/cache/flannel-udp/arch/ARCH: outside the checkout, made once and reused), with the
#            Debian packages the build and the tests need (ROOT_PACKAGES below)
#   install  the checkout's files (tracked and new, not ignored) copied to /srv/flannel-udp/src in
#            the root, and a venv /srv/flannel-udp/venv with the project's dependencies: from PyPI at
#            packaging/constraints.txt's versions where PyPI has wheels for ARCH (arm64); where it
#            has none (s390x: numpy, grpcio, matplotlib, pillow would compile for an hour under
#            emulation), a venv with --system-site-packages over Debian's packages instead, and
#            only pure-Python wheels from PyPI
#   build    the C engine: the extension through pip, as any install builds it, which must import;
#            and every file of csrc/sources.txt compiled with -Werror
#   test     the engine tests, the multi-queue tests and the fuzzers' corpora (TESTS below), with
#            tests/arch/emulated.py loaded: the tests QEMU cannot run are expected failures there,
#            each with its reason (that plugin lists them; nothing is skipped silently); the
#            checkout's tests/ are copied again first, the code is what the install step copied
#   bpf      (arm64 only) the kernel path as far as the emulator reaches, which has no bpf()
#            syscall (ENOSYS): its programs compiled in the root with the root's clang and
#            libbpf headers must be this machine's build, instruction for instruction, maps alike;
#            and the engine choice there must fall back to the C engine saying why, or refuse
#            --engine kernel (tests/arch/kernel_path_emulated.py)
#   cross    (arm64 only) tests/arch/check_cross_arch.py with this machine's .venv: an arm64
#            daemon from the root beside an amd64 one in one overlay, both engines; the Debian
#            package's daemon too when the deb step ran in the same call
#   deb      (not in the default) `make deb` in the root, the package installed there and its
#            daemon run: what a build host of ARCH does
#
# Every step prints how long it took. Emulated timings are no performance figures.
# Needs root on an amd64 (or other) Debian 12; installs qemu-user-static, binfmt-support and
# debootstrap from Debian. Something on a shared host may switch the binfmt handlers off between
# steps, so they are switched on again before each step that runs ARCH's programs.
#
# Environment: FLANNEL_UDP_ARCH_DIR (where the roots live), FLANNEL_UDP_ARCH_MIRROR (the Debian
# mirror, default http://deb.debian.org/debian), ARCH_TESTS (the test files or node ids instead of
# TESTS below), PYTEST_ARGS (more pytest arguments, e.g. -x).
set -euo pipefail

usage() { echo "usage: $0 arm64|s390x [host|root|install|build|test|bpf|cross|deb|shell]..." >&2; exit 2; }
die() { echo "tests/arch/run.sh: $*" >&2; exit 1; }

ARCH=${1:-}
[ -n "$ARCH" ] || usage
shift
case "$ARCH" in
  arm64) QEMU_ARCH=aarch64 ;;
  s390x) QEMU_ARCH=s390x ;;
  *) usage ;;
esac
[ "$(id -u)" = 0 ] || die "run as root (debootstrap, chroot, mounts)"
[ "$(dpkg --print-architecture)" != "$ARCH" ] || die "this machine is $ARCH: run make test"

CHECKOUT=$(cd "$(dirname "$0")/../.." && pwd)
ARCH_DIR=${FLANNEL_UDP_ARCH_DIR:-/var/cache/flannel-udp/arch}
ROOT=$ARCH_DIR/$ARCH
MIRROR=${FLANNEL_UDP_ARCH_MIRROR:-http://deb.debian.org/debian}
SUITE=bookworm
# in the root; not under /opt/flannel-udp, which is the Debian package's (the deb step)
SRC=/srv/flannel-udp/src
VENV=/srv/flannel-udp/venv
HOST_PACKAGES="qemu-user-static binfmt-support debootstrap"
# In every root: Python and the headers for the extension; gcc builds it; clang with its sanitizer
# runtime builds the fuzzers (tests/cbuild.py); ca-certificates for pip; iproute2 and iptables
# for a daemon run from the root (tests/arch/check_cross_arch.py); libbpf-dev: the kernel path's
# programs compile with the root's clang (the bpf step), and libbpf1 with it, which the daemon's
# probe opens. A changed list installs what it adds into the root (step_root), no new root.
ROOT_PACKAGES="python3 python3-venv python3-dev gcc libc6-dev clang libclang-rt-14-dev \
  ca-certificates iproute2 iptables libbpf-dev"
case "$ARCH" in
  # Debian's builds of what PyPI has no s390x wheels of at the pinned versions (and what pip
  # would otherwise compile: cffi), and of the test tools that need them.
  s390x) ROOT_PACKAGES="$ROOT_PACKAGES python3-numpy python3-cffi python3-grpcio \
  python3-setuptools python3-wheel python3-matplotlib python3-pil" ;;
esac
# The engine tests (both engines over socketpairs, the contract, the Python packet path), the
# multi-queue ones and the fuzzers' corpora; the same files as in `make test`, nothing rewritten.
TESTS=${ARCH_TESTS:-"tests/unit/test_engine_*.py tests/unit/test_pypath.py tests/unit/test_ipv4.py \
  tests/unit/test_contract.py tests/unit/test_native_contract.py tests/unit/test_c_layers.py \
  tests/unit/test_route_array.py tests/unit/test_routes.py tests/unit/test_train_table.py \
  tests/unit/test_queue_fallback.py tests/unit/test_queues_offload.py \
  tests/unit/test_fuzz_c.py tests/unit/test_fuzz_gso.py tests/unit/test_fuzz_train.py"}

timed() {   # timed NAME CMD...: runs CMD and says how long it took
  local name=$1 start rc
  shift
  start=$(date +%s)
  # in a subshell of its own with -e: inside `CMD || ...` bash would ignore -e in all of CMD
  set +e
  (set -e; "$@")
  rc=$?
  set -e
  echo "== $ARCH: $name took $(( $(date +%s) - start )) s (exit $rc)" >&2
  return $rc
}

host_packages() {
  local missing="" p
  for p in $HOST_PACKAGES; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
  if [ -n "$missing" ]; then
    echo "installing Debian packages:$missing" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
  fi
}

binfmt_on() {
  local entry=/proc/sys/fs/binfmt_misc/qemu-$QEMU_ARCH
  [ -e /proc/sys/fs/binfmt_misc/register ] ||
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
  echo 1 > /proc/sys/fs/binfmt_misc/status
  [ -e "$entry" ] || update-binfmts --import "qemu-$QEMU_ARCH" >/dev/null
  update-binfmts --enable "qemu-$QEMU_ARCH" >/dev/null 2>&1 || echo 1 > "$entry"
  grep -qx enabled "$entry" || die "the binfmt handler qemu-$QEMU_ARCH stays disabled"
  # F: the kernel opens the emulator at registration, so that it runs inside a root without it
  grep -q '^flags: .*F' "$entry" || die "the binfmt handler qemu-$QEMU_ARCH lacks the F flag"
}

# Keeps the handler on while a step runs: it was seen switched off in the middle of one (the
# emulated programs then fail with ENOEXEC, "Exec format error"). Each time is said.
binfmt_keeper() {
  local entry=/proc/sys/fs/binfmt_misc/qemu-$QEMU_ARCH
  while sleep 1; do
    if ! grep -qx enabled "$entry" 2>/dev/null || ! grep -qx enabled /proc/sys/fs/binfmt_misc/status; then
      echo 1 > /proc/sys/fs/binfmt_misc/status
      echo 1 > "$entry"
      echo "== $ARCH: the binfmt handler qemu-$QEMU_ARCH was switched off meanwhile; on again" >&2
    fi
  done
}

# in_root CMD...: CMD inside the root, as root, with /proc, /sys and /dev mounted in a mount
# namespace of its own: the mounts go away with the last process in it, also on failure, and
# never show outside.
in_root() {
  local keeper rc=0
  binfmt_on
  binfmt_keeper >/dev/null &
  keeper=$!
  unshare --mount --propagation private -- /bin/sh -c '
    r=$1; shift
    mount -t proc proc "$r/proc" && mount -t sysfs sysfs "$r/sys" && mount --rbind /dev "$r/dev" &&
    exec chroot "$r" /usr/bin/env -i HOME=/root LANG=C.UTF-8 \
      PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@"' sh "$ROOT" "$@" || rc=$?
  kill "$keeper" 2>/dev/null || true
  wait "$keeper" 2>/dev/null || true
  return $rc
}

mounted_under() { awk -v d="$1" '$2 == d || index($2, d "/") == 1 { print $2 }' /proc/self/mounts; }

step_root() {
  host_packages
  if [ ! -e "$ROOT/.flannel-udp-root" ]; then
    local new=$ROOT.new
    # a debootstrap killed midway may leave its mounts: never delete through them
    mounted_under "$new" | sort -r | xargs -r -n1 umount -l
    rm -rf --one-file-system "$new"
    mkdir -p "$ARCH_DIR"
    binfmt_on
    timed "debootstrap ($SUITE, $ARCH)" \
      debootstrap --arch="$ARCH" --variant=minbase "$SUITE" "$new" "$MIRROR" > "$ARCH_DIR/$ARCH.debootstrap.log"
    mounted_under "$new" | sort -r | xargs -r -n1 umount -l
    mv "$new" "$ROOT"
    touch "$ROOT/.flannel-udp-root"
  else
    echo "reusing the $ARCH root $ROOT" >&2
  fi
  cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
  # the package list is the stamp: a changed list installs what it adds
  if [ "$(cat "$ROOT/.flannel-udp-packages" 2>/dev/null)" != "$ROOT_PACKAGES" ]; then
    timed "apt-get install in the root" in_root sh -c "apt-get update -qq &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $ROOT_PACKAGES >/dev/null"
    echo "$ROOT_PACKAGES" > "$ROOT/.flannel-udp-packages"
  fi
}

# The certificate authorities this host's administrator added (Debian's place for them, e.g. a
# TLS-inspecting proxy's): pip in the root must trust what pip here trusts.
local_cas() {
  local d=/usr/local/share/ca-certificates
  [ -d "$d" ] && [ -n "$(ls -A "$d")" ] || return 0
  if ! diff -rq "$d" "$ROOT$d" >/dev/null 2>&1; then
    rm -rf --one-file-system "$ROOT$d" && cp -a "$d" "$ROOT$d"
    in_root update-ca-certificates >/dev/null
  fi
}

# copy_sources DIR: the checkout's files under DIR (tracked and new, not ignored) replace those in
# the root's copy
copy_sources() {
  if [ "$1" = . ]; then rm -rf --one-file-system "$ROOT$SRC"; else rm -rf --one-file-system "$ROOT$SRC/$1"; fi
  mkdir -p "$ROOT$SRC"
  (cd "$CHECKOUT" && git ls-files -z --cached --others --exclude-standard -- "$1" |
     while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
     tar -cf - --null -T -) | tar -xf - -C "$ROOT$SRC"
}

need_root() { [ -e "$ROOT/.flannel-udp-root" ] || die "no $ARCH root in $ROOT: run the root step first"; }

step_install() {
  need_root
  cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
  local_cas
  # the sources as the checkout has them now, build products left behind
  copy_sources .
  case "$ARCH" in
    s390x)
      in_root sh -c "test -x $VENV/bin/python || python3 -m venv --system-site-packages $VENV"
      # Pure-Python wheels only: pip's resolver would otherwise reach for grpcio>=1.80 and
      # compile it (Debian 12 has 1.51, which the engine tests never import; the daemon's etcd
      # client would run on it, below pyproject.toml's bound)
      in_root sh -c "cd $SRC && $VENV/bin/pip install -q --disable-pip-version-check --no-deps \
        --only-binary=:all: -c packaging/constraints.txt pyroute2 etcd-sdk-python protobuf \
        prometheus_client pytest pytest-timeout hypothesis iniconfig pluggy packaging \
        sortedcontainers rich markdown-it-py mdurl Pygments typing_extensions" ;;
    *)
      in_root sh -c "test -x $VENV/bin/python || python3 -m venv $VENV"
      # the project's requirements (pyproject.toml: its dependencies and the test extra) at the
      # pinned versions, wheels only: the project itself is the build step
      in_root sh -c "cd $SRC && $VENV/bin/pip install -q --disable-pip-version-check wheel &&
        $VENV/bin/python -c 'import tomllib; p = tomllib.load(open(\"pyproject.toml\", \"rb\"))[\"project\"]
print(\"\\n\".join(p[\"dependencies\"] + p[\"optional-dependencies\"][\"test\"]))' > /tmp/requirements.txt &&
        $VENV/bin/pip install -q --disable-pip-version-check --only-binary=:all: \
          -c packaging/constraints.txt -r /tmp/requirements.txt" ;;
  esac
}

step_build() {
  need_root
  # the extension as `pip install` builds it (csrc/build_ffi.py; an optional one, so the import
  # below is what tells a failed build)
  in_root sh -c "cd $SRC && $VENV/bin/pip install -q --disable-pip-version-check --no-deps \
    --no-build-isolation -e . && $VENV/bin/python -c '
from dataplane.engine import c_available, c_import_error
assert c_available(), c_import_error()
import platform; print(\"C engine built and imported on\", platform.machine())'"
  in_root sh -c "cd $SRC/csrc && for f in \$(awk '!/^#/ && NF { print \$1 }' sources.txt); do
      gcc -O2 -std=gnu11 -Wall -Wextra -Wno-unused-parameter -Werror -I. -c \$f -o /dev/null ||
        exit 1
    done && echo 'csrc/sources.txt: every file compiles with -Werror'"
}

step_deb() {
  need_root
  # `make deb` as on a build host of ARCH: Debian's packaging tools into the root (the Makefile
  # installs them), the package from the install step's copy; then installed, and its daemon
  # asked for its version (a chroot has no systemd: the postinst starts nothing)
  # dpkg --configure -a: what an interrupted earlier run left half-installed is finished first
  in_root sh -c "dpkg --configure -a && { command -v make >/dev/null || { apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends make >/dev/null; }; }"
  in_root sh -c "cd $SRC && rm -rf dist && make deb"
  in_root sh -c "cd $SRC && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    ./dist/flannel-udp_*_$ARCH.deb >/dev/null && dpkg -s flannel-udp | grep -E '^(Version|Architecture)' &&
    /usr/bin/flannel-udp --version"
}

step_test() {
  need_root
  copy_sources tests        # the tests as they are now; the code is the install step's
  local tests=$TESTS why
  # The files that import the daemon, and with it its etcd client, whose generated stubs refuse
  # at import a grpcio older than they were made for: where the root has none (s390x: Debian
  # 12's is 1.51 and PyPI has no s390x wheel), they are left out, and said to be.
  if ! why=$(in_root "$VENV/bin/python" -c 'import pyetcd' 2>&1); then
    tests=${tests/tests\/unit\/test_queues_offload.py/}
    echo "== $ARCH: left out tests/unit/test_queues_offload.py: the etcd client does not" \
      "import here: ${why##*$'\n'}" >&2
  fi
  # FLANNEL_UDP_EMULATED: what tests/arch/emulated.py checks before it marks anything.
  # detect_leaks=0: LeakSanitizer stops the process's threads to scan them, which QEMU user mode
  # does not emulate ("LeakSanitizer has encountered a fatal error" at every exit, after the
  # inputs ran clean); ASan and UBSan still check every input, and leaks are checked natively.
  in_root sh -c "cd $SRC && FLANNEL_UDP_EMULATED=qemu-$QEMU_ARCH ASAN_OPTIONS=detect_leaks=0 \
    $VENV/bin/python -m pytest \
    -p tests.arch.emulated -o timeout=1800 -rxXfE -q -p no:cacheprovider $tests ${PYTEST_ARGS:-}"
}

step_bpf() {
  [ "$ARCH" = arm64 ] || die "the bpf step compares with this machine's little-endian build: arm64 only"
  need_root
  local py=${FLANNEL_UDP_PYTHON:-$CHECKOUT/.venv/bin/python} obj=/srv/flannel-udp/flannel.bpf.o
  [ -x "$py" ] || die "no $py: make deps sets up this machine's side"
  copy_sources tests
  rm -f "$ROOT$obj"
  in_root sh -c "cd $SRC && $VENV/bin/python -m tests.arch.kernel_path_emulated build $obj"
  (cd "$CHECKOUT" && "$py" -m tests.arch.kernel_path_emulated compare "$ROOT$obj")
}

step_cross() {
  [ "$ARCH" = arm64 ] || die "the cross-architecture overlay is an arm64 daemon's (tests/arch/check_cross_arch.py)"
  local py=${FLANNEL_UDP_PYTHON:-$CHECKOUT/.venv/bin/python} which=venv
  [ -x "$py" ] || die "no $py: make deps sets up this machine's side"
  # the package's daemon only when this call built it from the checkout's sources
  [ "$DEB_BUILT" = 1 ] && which="venv or deb"
  (cd "$CHECKOUT" && "$py" -m pytest -q -rxXfE -p no:cacheprovider -k "$which" \
    tests/arch/check_cross_arch.py ${PYTEST_ARGS:-})
}

DEB_BUILT=0

main() {
  local steps=("$@") step
  if [ ${#steps[@]} -eq 0 ]; then
    steps=(root install build test)
    [ "$ARCH" = arm64 ] && steps+=(bpf cross)
  fi
  for step in "${steps[@]}"; do
    case "$step" in
      host) host_packages ;;
      root) timed "root (make or reuse)" step_root ;;
      install) timed "install" step_install ;;
      build) timed "build" step_build ;;
      test) timed "test" step_test ;;
      deb) timed "deb (make deb, install)" step_deb; DEB_BUILT=1 ;;
      bpf) timed "bpf (the programs built in the root, the choice there)" step_bpf ;;
      cross) timed "cross (an arm64 daemon beside an amd64 one)" step_cross ;;
      shell) in_root /bin/bash ;;      # a look around, by hand
      *) usage ;;
    esac
  done
}

# read whole before it runs: an edit of this file meanwhile cannot change a running recipe
main "$@"; exit
