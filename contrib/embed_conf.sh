#!/bin/sh
# embed_conf.sh: turns conf/ricochet.conf into a C string so the binary carries its default.
set -e
printf '/* generated from %s by contrib/embed_conf.sh: do not edit */\n' "$1"
printf '#include "conf.h"\n\nconst char ric_default_conf[] =\n'
sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/^/    "/' -e 's/$/\\n"/' "$1"
printf '    ;\n'
