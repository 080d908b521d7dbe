#!/bin/sh
# A --brindle-binary for brindle-perf that changes what its brindle hook
# runs: it execs $VROUTER_BIN (default target/release/brindle-vrouter)
# with the harness's arguments, --cpu's value replaced by $VROUTER_CPUS
# (if set) and `--polling $VROUTER_POLLING` added (if set). exec keeps the
# pid, so the harness's SIGTERM and /proc/<pid>/stat reach the vrouter.
#   VROUTER_POLLING=busy-poll brindle-perf run --scenario kernel,null-afxdp,brindle \
#       --brindle-binary vrouter/benches/perf-wrap.sh
bin=${VROUTER_BIN:-target/release/brindle-vrouter}
set -f
args=""
replace_next=0
for a in "$@"; do
  if [ "$replace_next" = 1 ]; then
    replace_next=0
    [ -n "$VROUTER_CPUS" ] && a="$VROUTER_CPUS"
  fi
  [ "$a" = "--cpu" ] && replace_next=1
  args="$args '$a'"
done
[ -n "$VROUTER_POLLING" ] && args="$args --polling '$VROUTER_POLLING'"
eval exec "\"$bin\"" "$args"
