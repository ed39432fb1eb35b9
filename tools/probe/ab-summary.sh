#!/usr/bin/env bash
# The means of an A/B (tools/probe/ab.sh's output, from FILE or stdin): one row per case (op,
# shape, T, routing and the case's extra flags), the mean µs of each variant over its rounds in
# the order the variants first appear, and each variant's change against the first one.
# Usage: tools/probe/ab-summary.sh [FILE]
awk '
  /^r[0-9]+ / && / us, / {
    v = $2
    k = $3 " " $4 " " $5 " " $6
    if (match($0, / \[[^]]*\]$/)) k = k substr($0, RSTART)
    split($0, parts, ": ")
    us = parts[2] + 0
    if (!(v in vseen)) { vseen[v] = 1; vorder[++nv] = v }
    if (!(k in kseen)) { kseen[k] = 1; korder[++nk] = k }
    sum[k, v] += us; cnt[k, v]++
  }
  END {
    if (nk == 0) { print "ab-summary: no A/B lines" > "/dev/stderr"; exit 1 }
    printf "%-52s", "case (mean us)"
    for (j = 1; j <= nv; j++) printf " %14s", substr(vorder[j], 1, 14)
    for (j = 2; j <= nv; j++) printf " %9s", "vs " substr(vorder[1], 1, 6)
    printf "\n"
    for (i = 1; i <= nk; i++) {
      k = korder[i]
      printf "%-52s", substr(k, 1, 52)
      for (j = 1; j <= nv; j++)
        if (cnt[k, vorder[j]]) printf " %14.3f", sum[k, vorder[j]] / cnt[k, vorder[j]]
        else printf " %14s", "-"
      b = cnt[k, vorder[1]] ? sum[k, vorder[1]] / cnt[k, vorder[1]] : 0
      for (j = 2; j <= nv; j++) {
        c = cnt[k, vorder[j]] ? sum[k, vorder[j]] / cnt[k, vorder[j]] : 0
        if (b > 0 && c > 0) printf " %+8.2f%%", 100 * (c / b - 1)
        else printf " %9s", "-"
      }
      printf "\n"
    }
  }' "${1:-/dev/stdin}"
