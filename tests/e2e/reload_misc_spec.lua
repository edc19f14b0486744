-- Reload hazards: the master's descriptors, a slow request across a reload, a changed pid file, a
-- resized lua_shared_dict, and a pid file that names a process which is not a master.
package.path = "tests/e2e/?.lua;" .. package.path
local H = require("helpers")
local socket = require("socket")

local CONF = [[
worker_processes 2;
error_log logs/error.log info;
pid {{PID}};
http {
    access_log logs/access.log;
    lua_shared_dict counts {{DICT}};
    upstream up { server {{UPSTREAM}}; }
    server {
        listen 127.0.0.1:{{PORT}};
        location / { proxy_pass http://up; proxy_set_header X-Generation {{GEN}}; }
    }
}
]]

local function fds(pid)
    local p = io.popen("ls /proc/" .. pid .. "/fd 2>/dev/null | wc -l")
    local n = tonumber(p:read("*a")); p:close(); return n
end

describe("reload hazards", function()
    local up, gw
    before_each(function()
        up = H.start_upstream()
        up:program({ default = { status = 200, body = "ok" }, routes = { ["/slow"] = { default = { delay_ms = 3000, body = "slow" } } } })
        gw = H.start_gateway({ conf = CONF, upstream = up, vars = { GEN = "one", PID = "logs/ricochet.pid", DICT = "1m" } })
    end)
    after_each(function() gw:stop(); up:stop() end)

    it("keeps the master's fds flat over 20 reloads and leaves no zombie", function()
        -- counted once the start is over: the master opens its pid file (and holds it) after it listens,
        -- and start_gateway returns once it listens
        gw:wait_pid_file()
        assert.truthy(H.wait_until(function() return #gw:workers() == 2 end, 20), gw:log())
        local before = fds(gw.pid)
        for i = 1, 20 do
            local code, out = gw:reload(CONF, { GEN = "g" .. i })
            assert.equal(0, code, out)
        end
        -- the old generations' workers leave, and their channels in the master close, as a busy machine lets them
        assert.truthy(H.wait_until(function() return #gw:workers() == 2 and fds(gw.pid) == before end, 30), gw:log())
        assert.equal(before, fds(gw.pid))
        local z = io.popen("ps -o stat= --ppid " .. gw.pid):read("*a")
        assert.is_nil(z:find("Z"), z)
    end)

    it("completes a slow request an old worker holds across a reload", function()
        local c = assert(H.connect(gw.port))
        local co = coroutine.wrap(function() return c:request({ path = "/slow", timeout = 10 }) end)
        -- send it, then reload while it is upstream
        local s = socket.tcp(); s:settimeout(10); assert(s:connect("127.0.0.1", gw.port))
        s:send("GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        H.sleep(0.3)
        local code, out = gw:reload(CONF, { GEN = "two" })
        assert.equal(0, code, out)
        local line = s:receive("*l")
        s:close(); c:close()
        assert.equal("HTTP/1.1 200 OK", line, gw:log())
    end)

    it("moves the pid file when a reload names another one (or refuses the change)", function()
        local code, out = gw:reload(CONF, { GEN = "two", PID = "logs/other.pid" })
        if code == 0 then
            code, out = gw:reload(CONF, { GEN = "three", PID = "logs/other.pid" })
            assert.equal(0, code, "after a reload that changed pid, -s reload no longer finds the master: " .. out)
        end
    end)

    it("starts a resized lua_shared_dict afresh (its entry is named by its size)", function()
        local code, out = gw:reload(CONF, { GEN = "two", DICT = "2m" })
        assert.equal(0, code, out)
        assert.matches("generation 2 serving", out)
        code, out = gw:reload(CONF, { GEN = "three", DICT = "1m" })
        assert.equal(0, code, out)
    end)
end)

describe("-s reload with a pid file naming a live process that is not a master", function()
    it("does not signal it", function()
        local dir = H.mkdtemp("stale")
        local conf = dir .. "/ricochet.conf"
        H.write_file(conf, "pid " .. dir .. "/ricochet.pid;\nhttp { server { listen 127.0.0.1:9; } }\n")
        local p = io.popen("sleep 30 & echo $!"); local pid = tonumber(p:read("*l")); p:close()
        H.write_file(dir .. "/ricochet.pid", pid .. "\n")
        local t0 = socket.gettime()
        local code, out = H.run({ H.bin(), "-p", dir, "-c", conf, "-s", "reload" }, { timeout = 70 })
        local took = socket.gettime() - t0
        local alive = os.execute("kill -0 " .. pid .. " 2>/dev/null")
        os.execute("kill " .. pid .. " 2>/dev/null")
        H.rm_rf(dir)
        assert.truthy(alive == 0 or alive == true, ("the process %d named by the pid file was killed by SIGHUP (exit %d after %.0f s: %s)"):format(pid, code, took, out))
        assert.equal(1, code, out)
        assert.matches("no master runs", out)
        assert.truthy(took < 10, ("it waited %.0f s"):format(took))
    end)
end)
