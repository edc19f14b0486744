#!/bin/sh
# contrib/deb/build.sh BUILD: builds BUILD/ricochet_VERSION_ARCH.deb from the built tree.
# The package: /usr/sbin/ricochet; /etc/ricochet/ricochet.conf (a conffile: the shipped
# conf/ricochet.conf with production paths: the pid file /run/ricochet.pid, logs in
# /var/log/ricochet, the idempotency store in /var/lib/ricochet); the systemd unit
# (ExecReload runs `ricochet -s reload`); /etc/logrotate.d/ricochet; the man page; the docs;
# the route script library, its test kit and the example scripts.
set -eu
build=${1:-build}
version=$(sed -n 's/^#define RIC_VERSION "\(.*\)"$/\1/p' core/ric_core.h)
arch=$(dpkg --print-architecture)
work=$build/deb
root=$work/root
rm -rf "$work"
mkdir -p "$root/DEBIAN"

make -s install BUILD="$build" DESTDIR="$root" PREFIX=/usr SYSCONFDIR=/etc > /dev/null
rm -f "$root/etc/ricochet/ricochet.conf.default"

# the shipped configuration, with the paths a service uses
sed -e 's|^error_log stderr notice;|error_log /var/log/ricochet/error.log notice;\npid /run/ricochet.pid;|' \
    -e "s|access_log stdout;|access_log /var/log/ricochet/access.log;|" \
    -e 's|lmdb:/tmp/ricochet-idempotency.mdb|lmdb:/var/lib/ricochet/idempotency.mdb|' \
    conf/ricochet.conf > "$root/etc/ricochet/ricochet.conf"
grep -q '^pid /run/ricochet.pid;' "$root/etc/ricochet/ricochet.conf"

install -d "$root/lib/systemd/system" "$root/etc/logrotate.d" "$root/var/log/ricochet" \
    "$root/var/lib/ricochet"
sed -e 's|/usr/local/sbin/|/usr/sbin/|g' -e 's|/usr/local/etc/|/etc/|g' \
    contrib/systemd/ricochet.service > "$root/lib/systemd/system/ricochet.service"
install -m 644 contrib/logrotate/ricochet "$root/etc/logrotate.d/ricochet"

# what the binary links against, by the packages that hold those libraries; the gateway's JSON
# module is its own, so lua-cjson is only the test kit's (ricochet/testing.lua runs scripts on it)
deps=$(ldd "$root/usr/sbin/ricochet" | awk '/=> \// { print $3 }' | while read -r lib; do
    dpkg -S "$(readlink -f "$lib")" 2>/dev/null || dpkg -S "$lib" 2>/dev/null || true
done | cut -d: -f1 | sort -u | grep -v '^libc6$' | tr '\n' ' ')
depends="libc6"
for p in $deps; do depends="$depends, $p"; done

size=$(du -sk "$root" | cut -f1)
cat > "$root/DEBIAN/control" <<EOF
Package: ricochet
Version: $version
Architecture: $arch
Maintainer: ricochet developers <ricochet@localhost>
Installed-Size: $size
Depends: $depends
Recommends: lua-cjson
Section: httpd
Priority: optional
Homepage: https://localhost/ricochet
Description: Lua-scriptable retry gateway for flaky or rate-limited HTTP APIs
 A reverse proxy that retries what is safe to repeat, within a deadline and
 an adaptive retry budget, replays request bodies, and with an idempotency
 store lets a keyed POST reach the upstream at most once. Reloads its whole
 configuration, and upgrades its binary, without dropping a request.
EOF
printf '/etc/ricochet/ricochet.conf\n/etc/logrotate.d/ricochet\n' > "$root/DEBIAN/conffiles"

cat > "$root/DEBIAN/postinst" <<'EOF'
#!/bin/sh
set -e
if [ "$1" = configure ]; then
    mkdir -p /var/log/ricochet /var/lib/ricochet
    if [ -d /run/systemd/system ]; then
        systemctl daemon-reload > /dev/null 2>&1 || true
        systemctl enable ricochet.service > /dev/null 2>&1 || true
        if systemctl is-active --quiet ricochet.service; then
            # the new binary takes the sockets over without dropping a request
            # (the unit follows the new master); a restart if it cannot
            /usr/sbin/ricochet -c /etc/ricochet/ricochet.conf -s upgrade > /dev/null 2>&1 \
                || systemctl restart ricochet.service || true
        else
            systemctl start ricochet.service || true
        fi
    fi
fi
EOF
cat > "$root/DEBIAN/prerm" <<'EOF'
#!/bin/sh
set -e
if [ "$1" = remove ] && [ -d /run/systemd/system ]; then
    systemctl stop ricochet.service > /dev/null 2>&1 || true
fi
EOF
cat > "$root/DEBIAN/postrm" <<'EOF'
#!/bin/sh
set -e
if [ "$1" = purge ]; then
    rm -rf /var/log/ricochet /var/lib/ricochet
fi
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload > /dev/null 2>&1 || true
fi
EOF
chmod 755 "$root/DEBIAN/postinst" "$root/DEBIAN/prerm" "$root/DEBIAN/postrm"

out=$build/ricochet_${version}_${arch}.deb
dpkg-deb --root-owner-group --build "$root" "$out" > /dev/null
echo "$out"
