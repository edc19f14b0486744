#!/bin/sh
# tests/layers.sh OBJDIR: the core's files call each other downward only.
# Reads every object's defined and used symbols (nm), makes the graph of
# which file calls (or reads data of) which, and peels off the files that
# call no file still in it, again and again. Whatever is left sits on a
# loop: each of its calls into another file left is printed, and the
# check fails. conf.c and conf_directives.c are one node (the parser and
# its directive table know each other by design).
set -u
dir=${1:?usage: tests/layers.sh OBJDIR}
for o in "$dir"/*.o; do
    f=$(basename "$o" .o)
    [ "$f" = conf_directives ] && f=conf
    nm "$o" | awk -v f="$f" '$2 ~ /^[TDBR]$/ { print "D", f, $3 } $1 == "U" { print "U", f, $2 }'
done | awk '
$1 == "D" { def[$3] = $2; files[$2] = 1; next }
{ use[++n] = $2 " " $3 }
END {
    for (i = 1; i <= n; i++) {
        split(use[i], p, " ")
        t = def[p[2]]
        if (t != "" && t != p[1] && !((p[1], t) in edge)) {
            edge[p[1], t] = p[2]
            out[p[1]]++
            inn[t]++
        }
    }
    # peel the files no one left calls, and those that call no one left
    do {
        peeled = 0
        for (f in files) {
            if (out[f] > 0 && inn[f] > 0) continue
            delete files[f]
            peeled = 1
            for (k in edge) {
                split(k, e, SUBSEP)
                if (e[1] == f || e[2] == f) { out[e[1]]--; inn[e[2]]--; delete edge[k] }
            }
        }
    } while (peeled)
    left = 0
    for (k in edge) {
        split(k, e, SUBSEP)
        printf "on a loop: %s.c calls %s.c (%s)\n", e[1], e[2], edge[k]
        left++
    }
    exit left > 0
}'
