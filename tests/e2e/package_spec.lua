-- The Debian package (make deb): its files, its conffiles, and its systemd unit's commands run as systemd
-- would run them (start, reload, stop), against the package's own binary and configuration, moved into
-- a scratch root (no systemd and no system install in a test).
package.path = "tests/e2e/?.lua;" .. package.path
local H = require("helpers")

local function sh(cmd)
    local code, out = H.run(cmd, { timeout = 120 })
    return code, out
end

-- The unit's value for key (the first line "key=value").
local function unit_value(unit, key)
    return unit:match("\n" .. key .. "=([^\n]*)")
end

describe("the Debian package", function()
    local build = os.getenv("BUILD") or "build"
    local deb, root

    setup(function()
        local code, out = sh("sh contrib/deb/build.sh " .. H.shell_quote(build))
        assert.equal(0, code, out)
        deb = out:match("(%S+%.deb)%s*$")
        assert.truthy(deb, out)
        root = H.mkdtemp("deb")
        code, out = sh("dpkg-deb -x " .. H.shell_quote(deb) .. " " .. H.shell_quote(root))
        assert.equal(0, code, out)
    end)

    teardown(function()
        if root then H.rm_rf(root) end
    end)

    it("holds the binary, its configuration as a conffile, the unit, logrotate, the man page and the test kit", function()
        local code, info = sh("dpkg-deb -I " .. H.shell_quote(deb))
        assert.equal(0, code, info)
        assert.matches("Package: ricochet", info)
        -- the gateway's JSON is its own: lua-cjson is the test kit's
        assert.not_matches("Depends: [^\n]*lua%-cjson", info)
        assert.matches("Recommends: [^\n]*lua%-cjson", info)
        assert.matches("Depends: [^\n]*libevent", info)
        local _, conffiles = sh("dpkg-deb -f " .. H.shell_quote(deb) .. " Package && dpkg-deb --ctrl-tarfile "
            .. H.shell_quote(deb) .. " | tar -xO ./conffiles")
        assert.matches("/etc/ricochet/ricochet.conf", conffiles)
        assert.matches("/etc/logrotate.d/ricochet", conffiles)
        for _, f in ipairs({ "/usr/sbin/ricochet", "/etc/ricochet/ricochet.conf", "/lib/systemd/system/ricochet.service",
            "/etc/logrotate.d/ricochet", "/usr/share/man/man8/ricochet.8.gz", "/usr/share/lua/5.1/ricochet/testing.lua",
            "/usr/share/lua/5.1/ricochet/api.lua", "/usr/share/doc/ricochet/REFERENCE.md" }) do
            assert.truthy(H.read_file(root .. f), f .. " is not in the package")
        end
        local conf = H.read_file(root .. "/etc/ricochet/ricochet.conf")
        assert.matches("\npid /run/ricochet%.pid;", conf)
        assert.matches("error_log /var/log/ricochet/error%.log", conf)
        assert.matches("lmdb:/var/lib/ricochet/", conf)
        local rotate = H.read_file(root .. "/etc/logrotate.d/ricochet")
        assert.matches("/var/log/ricochet/%*%.log", rotate)
        assert.matches("ricochet %-c /etc/ricochet/ricochet%.conf %-s reopen", rotate)
        code = sh("gzip -dc " .. H.shell_quote(root .. "/usr/share/man/man8/ricochet.8.gz") .. " | grep -q 'upgrade'")
        assert.equal(0, code)
    end)

    it("has a unit whose start, reload and stop work as systemd runs them", function()
        local unit = "\n" .. H.read_file(root .. "/lib/systemd/system/ricochet.service")
        assert.equal("notify", unit_value(unit, "Type"))
        assert.equal("all", unit_value(unit, "NotifyAccess"))
        assert.equal("SIGQUIT", unit_value(unit, "KillSignal"))
        local pre, start, reload = unit_value(unit, "ExecStartPre"), unit_value(unit, "ExecStart"),
            unit_value(unit, "ExecReload")
        assert.equal("/usr/sbin/ricochet -t -c /etc/ricochet/ricochet.conf", pre)
        assert.equal("/usr/sbin/ricochet -c /etc/ricochet/ricochet.conf", start)
        assert.equal("/usr/sbin/ricochet -c /etc/ricochet/ricochet.conf -s reload", reload)
        -- the package's files moved under root, and the demo's addresses to free ports
        local ports, upstream = H.free_ports(2), H.start_upstream()
        local port = ports[1]
        upstream:program({ default = { status = 200, body = "through the package" } })
        local function moved(s)
            return (s:gsub("/usr/sbin/", root .. "/usr/sbin/"):gsub("/etc/ricochet/", root .. "/etc/ricochet/")
                :gsub("/run/ricochet%.pid", root .. "/ricochet.pid"):gsub("/var/", root .. "/var/")
                :gsub("127%.0%.0%.1:8080", "127.0.0.1:" .. port)
                :gsub("127%.0%.0%.1:9901", "127.0.0.1:" .. ports[2])
                :gsub("127%.0%.0%.1:9000", "127.0.0.1:" .. upstream.port))
        end
        local conf_path = root .. "/etc/ricochet/ricochet.conf"
        H.write_file(conf_path, moved(H.read_file(conf_path)))
        local function argv(cmd)
            local out = {}
            for w in moved(cmd):gmatch("%S+") do out[#out + 1] = w end
            return out
        end
        local code, out = H.run(argv(pre))
        assert.equal(0, code, out)
        local master = H.start_process(argv(start), root .. "/stdout.log", { port = port })
        local ok, err = pcall(function()
            local r = assert(H.request(port, { path = "/" }))
            assert.equal(200, r.status, H.read_file(root .. "/var/log/ricochet/error.log"))
            assert.equal("through the package", r.body)
            code, out = H.run(argv(reload), { timeout = 70 })
            assert.equal(0, code, out)
            assert.matches("generation 2 serving", out)
            -- a reload with a broken configuration fails the unit's reload and keeps serving
            H.write_file(conf_path, H.read_file(conf_path):gsub("keepalive_timeout 75s;", "keepalive_timeout soon;"))
            code, out = H.run(argv(reload), { timeout = 70 })
            assert.equal(1, code, out)
            assert.matches("ricochet%.conf:%d+:", out)
            r = assert(H.request(port, { path = "/" }))
            assert.equal(200, r.status)
            -- KillSignal: the master drains and exits, removing its pid file
            master:signal("QUIT")
            assert.truthy(master:wait_exit(20), "the master did not stop on SIGQUIT")
            assert.is_nil(H.read_file(root .. "/ricochet.pid"))
        end)
        master:stop()
        upstream:stop()
        assert(ok, err)
    end)
end)
