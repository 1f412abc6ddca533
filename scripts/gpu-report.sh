#!/usr/bin/env bash
# The GPU report: on a machine with a real GPU (and no network), the golden suite on the GPU
# backend, then `bench step|optim|average` at sizes that fill a large GPU, each kernel's
# throughput as a fraction of the adapter's own buffer copy. Under 8 minutes on an H200.
#
#   scripts/gpu-report.sh --build          # here (needs cargo): the release binary and the
#                                          # golden runner into target/gpu-report/
#   scripts/gpu-report.sh [--quick]        # there, in a copy of this repository with
#                                          # target/gpu-report/ carried along; --quick: small
#                                          # sizes (what the test on lavapipe runs)
#
# The Vulkan loader must be installed where it runs (docs/performance.md says how to carry it).
# Output: the report on stdout and, with OUT set, $OUT/gpu-report.txt and $OUT/bench-*.json.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=target/gpu-report

if [ "${1:-}" = "--build" ]; then
  export PATH="$HOME/.cargo/bin:$PATH"
  cargo build --release --locked
  golden="$(cargo test --release --locked --test golden --no-run --message-format=json 2>/dev/null |
    sed -n 's/.*"executable":"\([^"]*golden[^"]*\)".*/\1/p' | tail -1)"
  [ -x "$golden" ] || { echo "gpu-report: could not build the golden runner" >&2; exit 1; }
  mkdir -p "$dir"
  cp target/release/distopt "$dir/distopt"
  cp "$golden" "$dir/golden"
  echo "gpu-report: $dir/distopt and $dir/golden ready ($(du -sh "$dir" | cut -f1)); copy the repository with $dir to the GPU machine"
  exit 0
fi

quick=0
[ "${1:-}" = "--quick" ] && quick=1
[ -x "$dir/distopt" ] && [ -x "$dir/golden" ] || {
  echo "gpu-report: run scripts/gpu-report.sh --build first (target/gpu-report/ is missing)" >&2
  exit 1
}
out="${OUT:-$(mktemp -d)}"
mkdir -p "$out"
log="$out/gpu-report.txt"
: >"$log"
say() { echo "$@" | tee -a "$log"; }

say "== distopt GPU report, $(date -u +%Y-%m-%dT%H:%MZ)"
"$dir/distopt" info 2>&1 | tee -a "$log"
say ""
say "== golden cases (PyTorch's outputs), CPU and GPU backends"
DISTOPT_GOLDEN_ROOT="$PWD" "$dir/golden" 2>&1 | grep -v '^GOLDEN-CASE' | tee -a "$log"

if [ "$quick" = 1 ]; then
  sizes=(2^20); ranks=4; repeats=3
else
  sizes=(2^24 2^26 2^28); ranks=8; repeats=10
fi
fraction() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[2]%d)' "$@" 2>/dev/null || true; }
say ""
say "== bench step (GPU backend): resident step vs the adapter's copy of the same bytes"
for n in "${sizes[@]}"; do
  r=$ranks
  [ "$n" = "2^28" ] && r=4
  f="$out/bench-step-$r-${n/^/_}.json"
  "$dir/distopt" bench step --backend gpu --ranks "$r" --elements "$n" --repeats "$repeats" --json >"$f"
  say "$(python3 - "$f" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(f"R={d['ranks']} N={d['elements']}: resident {d['resident_gbps']} GB/s, one-shot {d['oneshot_gbps']} GB/s, "
      f"adapter copy {d['copy_gbps']} GB/s -> resident/copy {d['resident_vs_copy']}")
PY
)"
done
say ""
say "== bench optim and average (GPU backend), fraction of the adapter's copy"
for what in optim average; do
  n=${sizes[0]}
  [ "$quick" = 0 ] && n=2^26
  f="$out/bench-$what.json"
  "$dir/distopt" bench "$what" --backend gpu --ranks "$ranks" --elements "$n" --params 1,1000 --repeats "$repeats" --json >"$f"
  say "$(python3 - "$f" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    print(f"{d['bench']} R={d['ranks']} N={d['elements']} {r['kernel']} P={r['params']}: {r['gbps']:.1f} GB/s = {r['ratio_to_copy']:.2f} of copy ({d['copy_gbps']:.1f} GB/s)")
PY
)"
done
say ""
say "gpu-report: done; log in $log"
