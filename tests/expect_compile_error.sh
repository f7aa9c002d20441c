# The harness both compile-error scripts source. The sourcing script defines
#   compile NAME BODY FLAGS...  (writes $tmp/NAME.log; its status: 0 when it compiled)
# (through `remembered`, below) and then calls expect_control and expect_error, and ends
# with `exit $failed`.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0

# Verdicts of earlier runs on this machine (the compile's status and output), keyed by all
# that decides them: the compiler's version, the command's words, every file under the
# include folders it names (-I), the text every case includes, preprocessed (system headers
# and all), and the case's own text. ccache keeps no failed compile, so without these every
# run compiles every mistake again (a minute with nvcc). Kept beside ccache's cache when
# ccache is installed (scripts/test.sh uses it); SIDCO_CHECK_CACHE names another folder, or,
# empty, none.
verdicts=${SIDCO_CHECK_CACHE-$(ccache -k cache_dir 2> /dev/null)}
[ -n "$verdicts" ] && [ -z "${SIDCO_CHECK_CACHE+set}" ] && verdicts=$verdicts/sidco-compile-verdicts
[ -n "$verdicts" ] && ! mkdir -p "$verdicts" 2> /dev/null && verdicts=""
# Verdicts unused for two weeks go (each use renews them): a header edit makes new keys.
[ -n "$verdicts" ] && find "$verdicts" -type f -mtime +14 -delete 2> /dev/null
remembered_count=0

# The version of the compiler a command runs (past a ccache in front), and of the C++
# compiler on PATH (nvcc's host compiler).
compiler_version() {
  local compiler=$1
  [[ $(basename "$compiler") == ccache ]] && compiler=$2
  "$compiler" --version 2>&1 | head -5
  c++ --version 2>&1 | head -1
}

# include_folders COMMAND...: the folders COMMAND's -I flags name, one a line.
include_folders() {
  local flag
  for flag in "$@"; do
    if [[ $flag == -I* ]] && [ -d "${flag#-I}" ]; then printf '%s\n' "${flag#-I}"; fi
  done
}

# key_text COMMAND...: standard input with the paths that differ between clones and runs
# (this run's scratch folder, the working folder, each include folder COMMAND names: the
# checkout's, absolute) written as names, so that a clone elsewhere finds the same verdicts.
key_text() {
  local folder script=(-e "s|$tmp|TMP|g" -e "s|$PWD|CWD|g")
  while read -r folder; do script+=(-e "s|$folder|INCLUDE|g"); done < <(include_folders "$@")
  sed "${script[@]}"
}

# shared_key SHARED_FILE COMMAND...: once a script, what every case's key shares: COMMAND's
# compiler and words, the include folders' files, and SHARED_FILE (what every case includes)
# preprocessed by COMMAND -E. Empty without verdicts.
shared_key() {
  [ -n "$verdicts" ] || return 0
  local shared=$1 folders
  shift
  mapfile -t folders < <(include_folders "$@")
  {
    compiler_version "$@"
    printf '%s\n' "$@"
    [ ${#folders[@]} -eq 0 ] || find "${folders[@]}" -type f -print0 | sort -z | xargs -0 sha256sum
    "$@" -E "$shared" 2> /dev/null
  } | key_text "$@" | sha256sum | cut -d' ' -f1
}

# remembered NAME SHARED FILE COMMAND...: runs COMMAND (its output into $tmp/NAME.log) and
# returns its status, or the verdict of a run whose key was the same (SHARED: shared_key's;
# with COMMAND's words and FILE, the case's own text).
remembered() {
  local name=$1 shared=$2 file=$3 key="" status
  shift 3
  if [ -n "$verdicts" ] && [ -n "$shared" ]; then
    key=$({ echo "$shared"; printf '%s\n' "$@"; cat "$file"; } | key_text "$@" | sha256sum | cut -d' ' -f1)
    if [ -f "$verdicts/$key.status" ] && [ -f "$verdicts/$key.log" ]; then
      touch "$verdicts/$key.status" "$verdicts/$key.log"
      cp "$verdicts/$key.log" "$tmp/$name.log"
      remembered_count=$((remembered_count + 1))
      return "$(cat "$verdicts/$key.status")"
    fi
  fi
  "$@" > "$tmp/$name.log" 2>&1
  status=$?
  if [ -n "$key" ]; then  # written whole, then renamed: a reader never sees half a verdict
    cp "$tmp/$name.log" "$verdicts/$key.log.$$" && mv "$verdicts/$key.log.$$" "$verdicts/$key.log"
    echo "$status" > "$verdicts/$key.status.$$" && mv "$verdicts/$key.status.$$" "$verdicts/$key.status"
  fi
  return $status
}

# How many verdicts came from earlier runs (printed at the end of a script).
say_remembered() {
  [ "$remembered_count" -gt 0 ] &&
    echo "($remembered_count verdicts as earlier runs on this machine gave them for the same inputs: $verdicts)"
  return 0
}

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
