#!/usr/bin/env bash
# The collector's checks on a real NVIDIA GPU: what the machine has (driver, NVML, DCGM,
# MIG), the hardware tests (collector/nvml/hardware_test.go, the NVML source's, and
# collector/hardware_test.go, the collector's end to end) under a CUDA load, and
# `gpuscaler collector --source auto` against `gpuscaler scaler` for a few seconds.
#
#   make hardware-binaries            # here: builds .hw/collector.test.gz, .hw/nvml.test.gz and .hw/gpuscaler.gz
#   hack/hardware-check.sh [.hw]      # there: on the GPU machine (needs python3 with torch)
#
# Everything it sees goes to $OUT (else ./hardware-out): check.log and the tools' output.
set -uo pipefail
dir=${1:-.hw}
out=${OUT:-hardware-out}
mkdir -p "$out"
exec > >(tee "$out/check.log") 2>&1
here=$(cd "$(dirname "$0")" && pwd)
for f in collector.test nvml.test gpuscaler; do
  if [[ -f $dir/$f.gz ]]; then gunzip -c "$dir/$f.gz" >"/tmp/$f"; else cp "$dir/$f" "/tmp/$f"; fi
  chmod +x "/tmp/$f"
done
step() { echo; echo "=== $*"; }

step machine
uname -a; ldd --version | head -1; nproc
nvidia-smi
nvidia-smi --query-gpu=index,uuid,name,pci.bus_id,driver_version,memory.total,mig.mode.current,compute_mode --format=csv
nvidia-smi -q >"$out/nvidia-smi-q.txt" 2>&1
step "NVIDIA libraries (NVML, DCGM)"
ldconfig -p | grep -E 'libnvidia-ml|libdcgm' || echo "ldconfig finds neither"
command -v nv-hostengine dcgmi || echo "no nv-hostengine or dcgmi on the PATH"
step "MIG profiles nvidia-smi lists (MIG mode is left as it is)"
nvidia-smi mig -lgip 2>&1 | head -40
step "this shell's cgroup (what the NVML source reads to find a process's pod)"
cat /proc/self/cgroup

step "CUDA load"
python3 "$here/gpu-load.py" 150 4096 >"$out/load.log" 2>&1 &
load=$!
for _ in $(seq 60); do grep -q loaded "$out/load.log" && break; kill -0 $load 2>/dev/null || break; sleep 1; done
cat "$out/load.log"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv
tests() { # tests PKG ARGS...: PKG's test binary (PKG.test), in its package's directory, as go test runs it
  local pkg=$1; shift
  (cd "$here/../$pkg" && timeout 150 "/tmp/$(basename "$pkg").test" -test.v -test.count=1 "$@") >>"$out/hardware-tests.log" 2>&1
  echo "tests exit ($pkg): $?"
}

step "hardware tests, with one load in no pod"
GPUSCALER_HW_LOAD_PID=$load GPUSCALER_HW_LOAD_MIB=4096 tests collector/nvml -test.run 'Hardware[^S]' -test.bench Hardware -test.benchtime 200x
GPUSCALER_HW_LOAD_PID=$load GPUSCALER_HW_LOAD_MIB=4096 tests collector -test.run 'Hardware[^S]'
kill $load 2>/dev/null; wait $load 2>/dev/null

step "two pods time-slicing the GPU: a busy one and one busy ${HW_POD_B_DUTY:-0.1} of the time (HW_POD_B_DUTY), each in a kubelet-shaped cgroup"
# The shapes the kubelet gives a container's cgroup (v2): the systemd driver's slices
# for pod A, the cgroupfs driver's directories for pod B (collector/cgroup's tests).
uid_a=4f2a9c1e-0b7d-4c55-9e21-6d3f8a7b2c10
uid_b=8d1e5f3a-7c2b-4a96-b0e4-1f9c3d6a5e27
cg_a=/sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod${uid_a//-/_}.slice/cri-containerd-$(printf 'a%.0s' {1..64}).scope
cg_b=/sys/fs/cgroup/kubepods/burstable/pod$uid_b/$(printf 'b%.0s' {1..64})
python3 "$here/gpu-load.py" 120 1024 >/tmp/load-a.log 2>&1 &
pod_a=$!
duty_b=${HW_POD_B_DUTY:-0.1}
python3 "$here/gpu-load.py" 120 1024 "$duty_b" >/tmp/load-b.log 2>&1 &
pod_b=$!
if [[ -f /sys/fs/cgroup/cgroup.controllers ]] && mkdir -p "$cg_a" "$cg_b" && echo $pod_a >"$cg_a/cgroup.procs" && echo $pod_b >"$cg_b/cgroup.procs"; then
  cat /proc/$pod_a/cgroup /proc/$pod_b/cgroup
  for _ in $(seq 60); do grep -q loaded /tmp/load-b.log && grep -q loaded /tmp/load-a.log && break; sleep 1; done
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv
  GPUSCALER_HW_POD_B_DUTY=$duty_b GPUSCALER_HW_POD_A_PID=$pod_a GPUSCALER_HW_POD_A_UID=$uid_a GPUSCALER_HW_POD_B_PID=$pod_b GPUSCALER_HW_POD_B_UID=$uid_b \
    tests collector -test.run HardwareShared
else
  echo "no cgroup v2 at /sys/fs/cgroup, or the pods' cgroups could not be made: the shared-GPU check is skipped"
fi
kill $pod_a $pod_b 2>/dev/null; wait $pod_a $pod_b 2>/dev/null
grep -E '^\s*(--- |FAIL|PASS|ok|Benchmark)|hardware_test.go' "$out/hardware-tests.log" | cut -c1-400

step "gpuscaler collector --source auto, against gpuscaler scaler (embedded NATS), 8 s"
data=$(mktemp -d)
/tmp/gpuscaler scaler --grpc-addr 127.0.0.1:9090 --http-addr 127.0.0.1:8080 --data-dir "$data" >"$out/scaler.log" 2>&1 &
scaler=$!
sleep 2
timeout 8 /tmp/gpuscaler collector --source auto --kubeconfig none --node hw-node --http-addr 127.0.0.1:8081 \
  --pod-resources-socket /run/none/kubelet.sock >"$out/collector.log" 2>&1 &
collector=$!
sleep 5
python3 - <<'PY' >"$out/collector-metrics.txt" 2>&1
import urllib.request
for path in ("/readyz", "/metrics"):
    try:
        print(urllib.request.urlopen("http://127.0.0.1:8081" + path, timeout=3).read().decode())
    except Exception as e:
        print(path, "->", e)
PY
wait $collector; echo "collector exit: $?"
kill $scaler; wait $scaler
head -c 3000 "$out/collector.log"
grep -E "^gpuscaler_collector" "$out/collector-metrics.txt" | head -30
