#!/usr/bin/env bash
# bench/lora-tried.md (the index of the lora ideas tried) names, in each table row's second
# column, the bench/NOTES.md entry that holds the experiment: every such name must open a line
# of NOTES' "## lora" section, and every table row must have the five columns.
# Usage: lora_tried_index_test.sh INDEX NOTES
set -u
index=$1 notes=$2
fail=0
# The "## lora" section: from its heading to the next "## " heading.
section=$(awk '/^## lora$/ {on = 1; next} on && /^## / {exit} on' "$notes")
[ -n "$section" ] || { echo "FAIL: no '## lora' section in $notes"; exit 1; }
heads=$(grep -E '^[^ -]' <<< "$section")  # the lines that open an entry
rows=0
while IFS= read -r line; do
  case "$line" in
    '| idea |'* | '|---'*) continue ;;
    '| '*) ;;
    *) continue ;;
  esac
  rows=$((rows + 1))
  # Five cells: "| a | b | c | d | e |" has six bars outside backquotes (cells hold no bars).
  bars=$(sed 's/`[^`]*`//g' <<< "$line" | tr -cd '|' | wc -c)
  if [ "$bars" -ne 6 ]; then
    echo "FAIL: row without five cells: $line"; fail=1; continue
  fi
  where=$(awk -F' [|] ' '{print $2}' <<< "$line")
  if ! grep -qxF -- "$where" <<< "$(cut -c1-${#where} <<< "$heads")"; then
    echo "FAIL: '$where' opens no entry of NOTES' lora section: $line"; fail=1
  fi
done < "$index"
[ "$rows" -ge 50 ] || { echo "FAIL: only $rows table rows in $index"; fail=1; }
[ $fail -eq 0 ] && echo "lora_tried_index: $rows rows, each naming a NOTES entry"
exit $fail
