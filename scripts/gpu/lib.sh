# Shared by the GPU area scripts (source it after setting $log):
#
#   run NAME SECONDS CMD...   runs CMD under a time limit, appends its output
#                             to $log, and adds "NAME PASS|FAIL(rc) seconds"
#                             to the status array; RUN_WIDTH sets the name
#                             column's width (default 44).
status=()
run() {
  local name=$1 limit=$2; shift 2
  echo "=== $name: $*" >>"$log"
  local t0 t1 r
  t0=$(date +%s.%N)
  if timeout -k 5 "$limit" "$@" >>"$log" 2>&1; then r=PASS; else r="FAIL($?)"; fi
  t1=$(date +%s.%N)
  status+=("$(printf "%-${RUN_WIDTH:-44}s %-9s %6.1fs" "$name" "$r" "$(awk "BEGIN{print $t1 - $t0}")")")
}
