# The harness both compile-error scripts source. The sourcing script defines
#   compile NAME BODY FLAGS...  (writes $tmp/NAME.log; its status: 0 when it compiled)
# and then calls expect_control and expect_error, and ends with `exit $failed`.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0

# The control: a correct body compiles through the same harness, or nothing is tested.
expect_control() {
  local body=$1
  shift
  if ! compile control "$body" "$@"; then
    echo "FAIL the control does not compile:"
    head -30 "$tmp/control.log"
    exit 1
  fi
}

# NAME must fail to compile, with SENTENCE in its errors.
expect_error() {
  local name=$1 sentence=$2 body=$3
  shift 3
  if compile "$name" "$body" "$@"; then
    echo "FAIL $name: compiled"
    failed=1
  elif ! grep -qF "$sentence" "$tmp/$name.log"; then
    echo "FAIL $name: the error does not say \"$sentence\":"
    head -20 "$tmp/$name.log"
    failed=1
  else
    echo "ok   $name: \"$sentence\""
  fi
}

# As expect_error, and the compiler says it first, in at most SHORT_ERROR_LINES (15) lines besides clang's
# "In file included from" chain: a wrong call reads as one sentence, not a list of candidates.
# SHORT_ERROR_NAMES: a pattern (the type at fault) the output must show by its first error line.
expect_short_error() {
  local name=$1 sentence=$2
  expect_error "$@"
  [ -f "$tmp/$name.log" ] || return 0
  local lines first
  lines=$(grep -v "^In file included from" "$tmp/$name.log" | grep -c .)
  first=$(grep -m1 "error" "$tmp/$name.log")
  local most=${SHORT_ERROR_LINES:-15}
  if [ "$lines" -gt "$most" ]; then
    echo "FAIL $name: $lines lines of errors (at most $most):"
    head -20 "$tmp/$name.log"
    failed=1
  elif [[ "$first" != *"$sentence"* ]]; then
    echo "FAIL $name: the first error is not the sentence: $first"
    failed=1
  elif [ -n "${SHORT_ERROR_NAMES:-}" ] && ! sed '/error/q' "$tmp/$name.log" | grep -q "$SHORT_ERROR_NAMES"; then
    echo "FAIL $name: the type at fault ($SHORT_ERROR_NAMES) is not named by the first error line:"
    sed '/error/q' "$tmp/$name.log"
    failed=1
  fi
}
