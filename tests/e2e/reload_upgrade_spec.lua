-- The binary upgrade's edges: a dropped address, a new master that never serves, the old master stopped
-- mid-upgrade, an address in use, a failing second upgrade, two upgrades at once.
package.path = "tests/e2e/?.lua;" .. package.path
local H = require("helpers")
local socket = require("socket")

local CONF = [[
worker_processes 1;
error_log logs/error.log info;
pid logs/ricochet.pid;
http {
    upstream up { server {{UPSTREAM}}; }
    server {
        listen 127.0.0.1:{{PORT}};
        {{EXTRA}}
        location / { proxy_pass http://up; }
    }
}
]]

local function ctx(gw, extra) return (extra or "") .. "\nlog:\n" .. (gw and gw:log() or "?") end

-- every process whose command line names dir, killed by pid
local function kill_under(dir)
    local p = io.popen("ls /proc")
    for pid in p:lines() do
        if pid:match("^%d+$") then
            local f = io.open("/proc/" .. pid .. "/cmdline", "rb")
            local c = f and f:read("*a") or ""
            if f then f:close() end
            if c:find(dir, 1, true) and c:find("ricochet", 1, true) and not c:find("busted", 1, true) then
                os.execute("kill -KILL " .. pid .. " 2>/dev/null")
            end
        end
    end
    p:close()
end

local function fds(pid)
    local p = io.popen("ls -l /proc/" .. pid .. "/fd 2>/dev/null")
    local out = p:read("*a"); p:close(); return out
end

describe("a binary upgrade at its edges", function()
    local up, gw, bindir, real
    local function pidfile() return gw.prefix .. "/logs/ricochet.pid" end
    local function pid_in_file() return tonumber(H.read_file(pidfile()) or "") end
    local function upgrade()
        gw:wait_pid_file()
        return H.run({ H.bin(), "-p", gw.prefix, "-c", gw.conf_path, "-s", "upgrade" }, { timeout = 70 })
    end
    local function wrapper(body)
        local w = bindir .. "/w"
        H.write_file(w, "#!/bin/sh\n" .. body .. "\n")
        assert(os.execute("chmod +x " .. w .. " && mv " .. w .. " " .. bindir .. "/ricochet"))
    end

    before_each(function()
        up = H.start_upstream()
        up:program({ default = { status = 200, body = "ok" } })
        bindir = H.mkdtemp("bin")
        real = bindir .. "/real"
        assert(os.execute("cp " .. H.shell_quote(H.bin()) .. " " .. bindir .. "/ricochet && cp "
            .. H.shell_quote(H.bin()) .. " " .. real))
    end)
    after_each(function()
        local pid = gw and pid_in_file()
        if gw then gw:stop() end
        if pid and pid ~= gw.pid then os.execute("kill -TERM " .. pid .. " 2>/dev/null") end
        H.sleep(0.5)
        if gw then kill_under(gw.prefix) end
        kill_under(bindir)
        if up then up:stop() end
        H.rm_rf(bindir)
    end)

    it("closes an address the config dropped before the upgrade (the new master does not keep it)", function()
        local p2 = H.free_port()
        gw = H.start_gateway({ conf = CONF, upstream = up, bin = bindir .. "/ricochet", ports = { PORT2 = p2 },
            vars = { EXTRA = "listen 127.0.0.1:" .. p2 .. ";" } })
        local r, err = H.request(gw.port2, { path = "/a", timeout = 20 })
        assert.equal(200, r and r.status, ctx(gw, err))
        H.write_file(gw.conf_path, gw:render(CONF, { EXTRA = "" }))
        local code, out = upgrade()
        assert.equal(0, code, ctx(gw, out))
        local new = pid_in_file()
        assert.truthy(gw:wait_exit(20))
        print("\nnew master fds:\n" .. fds(new))
        local c = socket.tcp(); c:settimeout(2)
        local ok = c:connect("127.0.0.1", gw.port2)
        local got
        if ok then
            c:send("GET /b HTTP/1.1\r\nHost: x\r\n\r\n")
            got = c:receive("*l")
        end
        c:close()
        assert.is_nil(ok, "connect to the dropped address succeeded; answer: " .. tostring(got))
    end)

    it("keeps the old master's pid file when a new master that never serves is stopped", function()
        gw = H.start_gateway({ conf = CONF, upstream = up, bin = bindir .. "/ricochet", vars = { EXTRA = "" } })
        -- a new master that never tells the old one (stands in for workers not serving in 30 s)
        wrapper("RICOCHET_UPGRADE_FROM=0 exec " .. real .. ' "$@"')
        local code, out = upgrade()
        assert.equal(1, code, out)
        assert.matches("did not start serving in time", out)
        H.sleep(2)
        assert.truthy(gw:alive())
        assert.equal(gw.pid, pid_in_file(), "pid file after a timed-out upgrade: " .. tostring(H.read_file(pidfile())) .. ctx(gw))
    end)

    it("stops the new master too when the old one is stopped mid-upgrade", function()
        gw = H.start_gateway({ conf = CONF, upstream = up, bin = bindir .. "/ricochet", vars = { EXTRA = "" } })
        wrapper("RICOCHET_UPGRADE_FROM=0 exec " .. real .. ' "$@"')
        os.execute(("%s -p %s -c %s -s upgrade > %s/up.out 2>&1 &"):format(H.bin(), gw.prefix, gw.conf_path, gw.prefix))
        local new = H.wait_until(function() local p = pid_in_file(); return p and p ~= gw.pid and p end, 10)
        assert.truthy(new)
        H.sleep(0.5)
        gw:signal("TERM")
        assert.truthy(gw:wait_exit(10))
        H.sleep(0.5)
        local alive = H.read_file("/proc/" .. new .. "/status") ~= nil
        local r = H.request(gw.port, { path = "/x", timeout = 2 })
        print(("\nnew master %d alive=%s, pid file=%s, oldbin=%s, request status=%s"):format(new, tostring(alive),
            tostring(H.read_file(pidfile())), tostring(H.read_file(pidfile() .. ".oldbin")), tostring(r and r.status)))
        os.execute("kill -TERM " .. new .. " 2>/dev/null")
        assert.is_false(alive and H.read_file(pidfile()) == nil, "a master serves with no pid file")
    end)

    it("a new config that binds an address in use: refused, old one serves, pid file back", function()
        gw = H.start_gateway({ conf = CONF, upstream = up, bin = bindir .. "/ricochet", vars = { EXTRA = "" } })
        local blocker = assert(socket.bind("127.0.0.1", 0))
        local _, bport = blocker:getsockname()
        H.write_file(gw.conf_path, gw:render(CONF, { EXTRA = "listen 127.0.0.1:" .. bport .. ";" }))
        local code, out = upgrade()
        blocker:close()
        print("\n" .. out)
        assert.equal(1, code, out)
        assert.equal(gw.pid, pid_in_file())
        assert.equal(200, H.request(gw.port, { path = "/y" }).status)
    end)

    it("upgrade, then a failing second upgrade: the pid file names the serving master", function()
        gw = H.start_gateway({ conf = CONF, upstream = up, bin = bindir .. "/ricochet", vars = { EXTRA = "" } })
        local code, out = upgrade()
        assert.equal(0, code, out)
        local new = pid_in_file()
        assert.truthy(gw:wait_exit(20))
        print("\nold-master fds were n/a; new master fds:\n" .. fds(new))
        wrapper("exit 3")
        code, out = upgrade()
        print(out)
        assert.equal(1, code, out)
        assert.equal(new, pid_in_file())
        assert.is_nil(H.read_file(pidfile() .. ".oldbin"))
        -- and a third that works
        assert(os.execute("cp " .. real .. " " .. bindir .. "/ricochet"))
        code, out = upgrade()
        assert.equal(0, code, out)
        local third = pid_in_file()
        assert.truthy(third and third ~= new)
        assert.equal(200, H.request(gw.port, { path = "/z" }).status)
    end)

    it("two -s upgrade at once", function()
        gw = H.start_gateway({ conf = CONF, upstream = up, bin = bindir .. "/ricochet", vars = { EXTRA = "" } })
        wrapper("sleep 1; exec " .. real .. ' "$@"')
        os.execute(("%s -p %s -c %s -s upgrade > %s/up1.out 2>&1 &"):format(H.bin(), gw.prefix, gw.conf_path, gw.prefix))
        H.sleep(0.2)
        local code, out = upgrade()
        H.wait_until(function() return (H.read_file(gw.prefix .. "/up1.out") or "") ~= "" end, 40)
        print("\nsecond: rc=" .. code .. " " .. out .. "\nfirst: " .. tostring(H.read_file(gw.prefix .. "/up1.out")))
    end)
end)
