#!/usr/bin/env bash
# `checks/cgroup2.sh` on a host whose cgroups are v1 (this project's CI, this machine): boots
# Debian's current kernel in an emulated guest (qemu, TCG: the nested KVM of these machines
# does not boot a stock kernel) whose root is this host's own, read-only through 9p under a
# tmpfs overlay, mounts cgroup v2 alone (with nsdelegate, as systemd does) and runs every
# cgroup v2 check there. Run as root; it prints the guest's console and exits with the checks'
# status. Nothing the guest writes reaches this host.
#
# Needs apt (the kernel, qemu-system-x86 and busybox-static come from Debian's archive), cargo,
# and this checkout's test images' sources (it builds every binary here first; the guest only
# runs them). Emulation makes everything about ten times slower: the guest sets
# CORDON_TEST_SLOWDOWN=10, which scales only a stage's whole deadline, never a bound a check
# probes (cordon_testkit::slowdown). About 5 minutes here.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "checks/cgroup2-vm.sh: run as root" >&2; exit 1; }
work=$PWD/target/cgroup2-vm
mkdir -p "$work"

need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
[ -x /bin/busybox ] && ! ldd /bin/busybox >/dev/null 2>&1 || need+=(busybox-static)
if [ ${#need[@]} -gt 0 ]; then
    apt-get install -y -q "${need[@]}" >/dev/null
fi

# The kernel: Debian's, as the archive serves it today (only the check's guest runs it).
kpkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
[ -n "$kpkg" ] || { echo "checks/cgroup2-vm.sh: apt knows no linux-image-amd64" >&2; exit 1; }
if [ ! -d "$work/$kpkg" ]; then
    rm -rf "$work/deb" && mkdir -p "$work/deb"
    (cd "$work/deb" && apt-get download -q "$kpkg" 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
    deb=$(ls "$work/deb"/"$kpkg"_*.deb)
    dpkg-deb -x "$deb" "$work/$kpkg.partial"
    mv "$work/$kpkg.partial" "$work/$kpkg"
fi
kernel=$(ls "$work/$kpkg"/boot/vmlinuz-*)

# The initramfs: busybox, the modules a 9p root and the overlay need (in load order), an init
# that mounts this host's root read-only under a tmpfs overlay and switches to guest-init.
modules=(virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci netfs fscache
    9pnet 9pnet_virtio 9p overlay)
ird=$work/initrd
rm -rf "$ird" && mkdir -p "$ird"/{bin,lib/modules,proc,sys,dev,host,up,newroot}
cp /bin/busybox "$ird/bin/busybox"
for m in "${modules[@]}"; do
    f=$(find "$work/$kpkg/lib/modules" -name "$m.ko" -o -name "$m.ko.xz" | head -1)
    [ -n "$f" ] || { echo "checks/cgroup2-vm.sh: $kpkg has no module $m" >&2; exit 1; }
    case $f in
    *.xz) xz -dc "$f" >"$ird/lib/modules/$m.ko" ;;
    *) cp "$f" "$ird/lib/modules/$m.ko" ;;
    esac
done
cat >"$ird/init" <<EOF
#!/bin/busybox sh
B=/bin/busybox
\$B mount -t proc proc /proc; \$B mount -t sysfs sys /sys; \$B mount -t devtmpfs dev /dev
for m in ${modules[*]}; do \$B insmod /lib/modules/\$m.ko || echo "cgroup2-vm: insmod \$m failed"; done
\$B mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000 hostroot /host || echo "cgroup2-vm: rc=9p"
\$B mount -t tmpfs -o size=12g tmpfs /up && \$B mkdir /up/u /up/w
\$B mount -t overlay overlay -o lowerdir=/host,upperdir=/up/u,workdir=/up/w /newroot || echo "cgroup2-vm: rc=overlay"
\$B umount /proc /sys; \$B mount --move /dev /newroot/dev
exec \$B switch_root /newroot $work/guest-init
EOF
chmod +x "$ird/init"
(cd "$ird" && find . | busybox cpio -o -H newc 2>/dev/null | gzip -1 >"$work/initrd.gz")

cat >"$work/guest-init" <<EOF
#!/bin/sh
mount -t proc proc /proc; mount -t sysfs sys /sys
mkdir -p /dev/pts /dev/shm; mount -t devpts devpts /dev/pts; mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /run
mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup
# /tmp, where the tests make their stores and run directories: a tmpfs of its own, in RAM
# rather than in the overlay's upper layer.
mount -t tmpfs -o size=10g tmpfs /tmp
ip link set lo up
export PATH=$PATH HOME=/root CARGO_NET_OFFLINE=true CORDON_TEST_SLOWDOWN=10
echo "cgroup2-vm: guest kernel \$(uname -r), controllers: \$(cat /sys/fs/cgroup/cgroup.controllers)"
cd $PWD && checks/cgroup2.sh
echo "cgroup2-vm: rc=\$?"
echo o >/proc/sysrq-trigger
sleep 60
EOF
chmod +x "$work/guest-init"

# Everything the checks run, built here: the guest only finds it up to date.
bash images/fetch-sources.sh >/dev/null
cargo build --quiet --workspace --bins
cargo test --quiet -p cordon-surface --test root_surface --no-run
cargo test --quiet -p cordon-prebuild --test root_hostile --no-run

mem=$(($(awk '/MemTotal/ {print $2}' /proc/meminfo) / 2 / 1024))
log=$work/guest.log
timeout 3600 qemu-system-x86_64 -accel tcg -smp "$(nproc)" -m "$((mem < 12288 ? mem : 12288))M" \
    -nographic -no-reboot -kernel "$kernel" -initrd "$work/initrd.gz" \
    -append "console=ttyS0 quiet panic=-1" -nic none \
    -virtfs local,path=/,mount_tag=hostroot,security_model=passthrough,readonly=on,multidevs=remap |
    tee "$log" || true
rc=$(tr -d '\r' <"$log" | sed -n 's/^cgroup2-vm: rc=//p' | tail -1)
if [ "$rc" != 0 ]; then
    echo "checks/cgroup2-vm.sh: the checks in the guest ended with ${rc:-no status} (console: $log)" >&2
    exit 1
fi
echo "checks/cgroup2-vm.sh: every cgroup v2 check passed in the guest"
