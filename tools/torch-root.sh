#!/usr/bin/env bash
# A PyTorch 2.x for the interoperability tests, on a machine whose own
# python3 has none (Debian 12's python3-torch is 1.13): a Debian root of a
# newer suite with its python3-torch, made with debootstrap, entered with
# chroot. Debian builds PyTorch without libuv, so such a root gives the 2.x
# client (VALIDATE, PING, the newer ops) and the 2.x poll() server
# (TCPStoreBackend); the libuv server needs a PyTorch from elsewhere, such
# as the GPU machines' python3.
#
#   tools/torch-root.sh create [SUITE [DIR]]  # as root; SUITE trixie (2.6)
#                                             # or sid; DIR /opt/uvccl-torch/SUITE
#                                             # (TORCH_ROOT_DEV=1: also what
#                                             # building the backend takes)
#   tools/torch-root.sh list                  # the roots there are, one a line
#   tools/torch-root.sh run DIR CMD [ARG...]  # CMD inside DIR, as root
#
# `run` mounts /proc in the root if it is not, copies the repository's
# Python test scripts to DIR/uvccl (t/torch_modern_client.py and t/py/), and
# execs chroot, so CMD keeps the caller's pid. The tests find the roots
# under /opt/uvccl-torch, or in UVCCL_TORCH_ROOTS (colon-separated).
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
base=/opt/uvccl-torch

die() {
  echo "torch-root: $*" >&2
  exit 2
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
create)
  suite=${1:-trixie}
  dir=${2:-$base/$suite}
  [ "$(id -u)" -eq 0 ] || die "create needs root (debootstrap, chroot)"
  command -v debootstrap >/dev/null ||
    DEBIAN_FRONTEND=noninteractive apt-get install -y debootstrap
  # A mirror may serve an unstable suite whose Release has expired.
  apt_opts="-o Acquire::Check-Valid-Until=false"
  if [ ! -x "$dir/usr/bin/python3" ]; then
    debootstrap --variant=minbase --include=python3,ca-certificates \
      "$suite" "$dir" http://deb.debian.org/debian
  fi
  mountpoint -q "$dir/proc" || mount -t proc proc "$dir/proc"
  dev=""
  [ "${TORCH_ROOT_DEV:-0}" = 1 ] &&
    dev="libtorch-dev python3-dev pybind11-dev g++ make libuv1-dev libssl-dev pkg-config python3-pip python3-venv python3-setuptools"
  chroot "$dir" /bin/sh -c "apt-get $apt_opts update -q &&
    DEBIAN_FRONTEND=noninteractive apt-get $apt_opts install -y \
      --no-install-recommends python3-torch $dev"
  chroot "$dir" python3 -c \
    'import torch, torch.distributed; print("torch", torch.__version__)'
  echo "torch-root: $dir ready"
  ;;
list)
  if [ -n "${UVCCL_TORCH_ROOTS:-}" ]; then
    roots=$(echo "$UVCCL_TORCH_ROOTS" | tr : ' ')
  else
    roots=$(ls -d "$base"/*/ 2>/dev/null || true)
  fi
  for d in $roots; do
    d=${d%/}
    [ -x "$d/usr/bin/python3" ] && echo "$d"
  done
  true
  ;;
run)
  [ $# -ge 2 ] || die "usage: torch-root.sh run DIR CMD [ARG...]"
  dir=$1
  shift
  [ -x "$dir/usr/bin/python3" ] || die "$dir is not a root with python3"
  [ "$(id -u)" -eq 0 ] || die "run needs root (chroot)"
  mountpoint -q "$dir/proc" || mount -t proc proc "$dir/proc"
  # Into a fresh folder, renamed over the old one: a run that is reading
  # the scripts meanwhile keeps the old inodes.
  stage=$(mktemp -d "$dir/uvccl.XXXXXX")
  cp "$here/t/torch_modern_client.py" "$stage/"
  cp -r "$here/t/py" "$stage/py"
  chmod 755 "$stage"
  rm -rf "$dir/uvccl.old"
  [ -e "$dir/uvccl" ] && mv "$dir/uvccl" "$dir/uvccl.old"
  mv "$stage" "$dir/uvccl"
  exec chroot "$dir" "$@"
  ;;
*)
  die "usage: torch-root.sh create [SUITE [DIR]] | list | run DIR CMD [ARG...]"
  ;;
esac
