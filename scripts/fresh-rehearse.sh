#!/usr/bin/env bash
# Times the README's main command as a newcomer meets it: on a fresh Debian 12 (debootstrap's
# minbase, in a folder of its own), a fresh clone of HEAD, no compiler cache and no pip cache.
# What the fresh system gets from this machine: its certificate authorities (pip reaches PyPI
# through them here) and, read-only, its CUDA toolkit (/usr/local/cuda: the machines this project
# runs on have one, and the torch wheel's CMake files need its nvcc). Prints the seconds of apt,
# of the wheel's download and install, and of the build and run. Needs root and debootstrap.
#   CKPT_FRESH_ROOT     the fresh system's folder (default /var/tmp/ckpt-fresh; removed afterwards)
#   CKPT_FRESH_KEEP     set: the folder stays, and a later run starts from it (no longer fresh)
#   CKPT_FRESH_NO_CUDA  set: no CUDA toolkit lent (setup.sh then installs NVIDIA's compiler wheels)
set -euo pipefail
cd "$(dirname "$0")/.."
root=${CKPT_FRESH_ROOT:-/var/tmp/ckpt-fresh}
if [ ! -x "$root/bin/bash" ]; then
  echo "ckpt: making a minimal Debian 12 in $root (not timed)"
  debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian > "$root.log" 2>&1 ||
    { tail -20 "$root.log"; exit 1; }
fi
cp /etc/resolv.conf "$root/etc/resolv.conf"
cp /etc/ssl/certs/ca-certificates.crt "$root/etc/host-ca.crt"
rm -rf "$root/root/ckpt" && git clone -q . "$root/root/ckpt"
cuda=""
if [ -z "${CKPT_FRESH_NO_CUDA:-}" ]; then
  cuda=$(readlink -f /usr/local/cuda)
  mkdir -p "$root$cuda" && ln -sfn "$cuda" "$root/usr/local/cuda"
fi

# In a mount namespace of its own: the mounts go with the run.
status=0
unshare --mount --propagation private bash -c '
  set -e
  root=$1 cuda=$2
  mount -t proc proc "$root/proc"
  mount --rbind /dev "$root/dev"
  mount --rbind /sys "$root/sys"
  [ -z "$cuda" ] || mount --bind -o ro "$cuda" "$root$cuda"
  exec chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb PIP_CERT=/etc/host-ca.crt \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin /bin/bash -c "
      set -eo pipefail
      cd /root/ckpt
      stamp() { while IFS= read -r line; do printf \"%(%s)T %s\n\" -1 \"\$line\"; done; }
      start=\$(date +%s)
      bash scripts/setup.sh 2>&1 | stamp
      set_up=\$(date +%s)
      bash scripts/main.sh 2>&1 | stamp
      echo \"setup \$((set_up - start)) s, build and run \$((\$(date +%s) - set_up)) s\"
    "' fresh "$root" "$cuda" | tee /tmp/ckpt-fresh-rehearsal.log || status=$?

# apt ends where the wheel's install begins (setup.sh says so).
awk 'NR == 1 { t0 = $1 } /installing torch==/ { w = $1 }
     /^setup / { print "ckpt: apt " w - t0 " s, the wheel " $2 - (w - t0) " s, build and run " $7 " s" }' \
  /tmp/ckpt-fresh-rehearsal.log
[ -n "${CKPT_FRESH_KEEP:-}" ] || rm -rf "$root" "$root.log"
exit $status
