-- Hot reload: SIGHUP and `ricochet -s reload` start a new configuration generation beside the running
-- one, which drains; a config that cannot serve is refused and the running one keeps serving.
package.path = "tests/e2e/?.lua;" .. package.path
local H = require("helpers")
local socket = require("socket")

local ctx = H.context

-- Two generations of one config: what the upstream sees says which one answered.
local CONF = [[
worker_processes 2;
error_log logs/error.log info;
pid logs/ricochet.pid;
http {
    # far above what these hooks take, however busy the machine (the bound counts wall time);
    # script_bounds_spec tests the bound
    script_timeout 1s;
    access_log logs/access.log;
    upstream up { server {{UPSTREAM}}; }
    server {
        listen 127.0.0.1:{{PORT}};
        idempotency_store lmdb:{{PREFIX}}/idem.mdb;
        location / {
            proxy_pass http://up;
            proxy_set_header X-Generation {{GEN}};
        }
    }
}
]]

-- The generation the next request meets (the X-Generation the upstream saw), or nil.
local function generation(gw, up) return H.seen_upstream(gw.port, up, "x-generation") end

describe("hot reload", function()
    local up, gw

    before_each(function()
        up = H.start_upstream()
        up:program({ default = { status = 200, body = "ok" } })
        gw = H.start_gateway({ conf = CONF, upstream = up, vars = { GEN = "one" } })
    end)

    after_each(function()
        if gw then gw:stop() end
        if up then up:stop() end
    end)

    it("serves the new config on the next request, and -s reload says so", function()
        assert.equal("one", generation(gw, up), ctx(gw))
        local code, out = gw:reload(CONF, { GEN = "two" })
        assert.equal(0, code, ctx(gw, out))
        assert.matches("configuration generation 2 serving: 2 workers", out)
        assert.equal("two", generation(gw, up), ctx(gw))
        -- the old workers drain and exit; two remain
        assert.truthy(H.wait_until(function() return #gw:workers() == 2 end, 10), ctx(gw))
    end)

    it("refuses a config with a bad directive: -s reload exits 1 naming FILE:LINE, the old one serves", function()
        local bad = CONF:gsub("proxy_pass http://up;", "proxy_pass http://up;\n            no_such_directive on;")
        local code, out = gw:reload(bad, { GEN = "two" })
        assert.equal(1, code, out)
        assert.matches("ricochet%.conf:%d+: ", out)
        assert.matches("no_such_directive", out)
        assert.equal("one", generation(gw, up), ctx(gw))
    end)

    it("refuses a script that does not compile and a certificate that is missing, naming the file", function()
        local script = gw.prefix .. "/broken.lua"
        H.write_file(script, "local route = {}\nfunction route.on_request(req)\n  if then end\nend\nreturn route\n")
        local with_script = CONF:gsub("proxy_pass http://up;", "proxy_pass http://up;\n            script " .. script .. ";")
        local code, out = gw:reload(with_script, { GEN = "two" })
        assert.equal(1, code, out)
        assert.matches("broken%.lua:3:", out)
        local with_cert = CONF:gsub("listen 127%.0%.0%.1:{{PORT}};", "listen 127.0.0.1:{{PORT}};\n        listen 127.0.0.1:{{PORT2}} ssl;\n"
            .. "        ssl_certificate " .. gw.prefix .. "/none.pem;\n        ssl_certificate_key " .. gw.prefix .. "/none.key;")
        code, out = gw:reload(with_cert, { GEN = "two" })
        assert.equal(1, code, out)
        assert.matches("none%.pem", out)
        assert.equal("one", generation(gw, up), ctx(gw))
        -- and the master was never asked: one generation all along
        assert.is_nil(gw:log():find("generation 2"))
    end)

    it("changes the number of workers", function()
        local three = CONF:gsub("worker_processes 2;", "worker_processes 3;")
        local code, out = gw:reload(three, { GEN = "two" })
        assert.equal(0, code, out)
        assert.matches("serving: 3 workers", out)
        assert.truthy(H.wait_until(function() return #gw:workers() == 3 end, 10), ctx(gw))
    end)

    it("refuses a config on a raw SIGHUP too: the reason is logged, the old one serves", function()
        local bad = CONF:gsub("proxy_pass http://up;", "proxy_pass http://nowhere;")
        H.write_file(gw.conf_path, gw:render(bad, { GEN = "two" }))
        gw:signal("HUP")
        assert.truthy(H.wait_until(function() return gw:log():find("reload refused: .-ricochet%.conf:%d+:") end, 10),
            ctx(gw))
        assert.matches("configuration generation 1 keeps serving", gw:log())
        assert.equal("one", generation(gw, up), ctx(gw))
    end)

    it("refuses an address another socket holds, and keeps serving on the old ones", function()
        local taken = assert(socket.bind("127.0.0.1", 0)) -- bound at once: no other process can take it first
        local port = tonumber((select(2, taken:getsockname())))
        local more = CONF:gsub("listen 127%.0%.0%.1:{{PORT}};", "listen 127.0.0.1:{{PORT}};\n        listen 127.0.0.1:{{TAKEN}};")
        local code, out = gw:reload(more, { GEN = "two", TAKEN = port })
        taken:close()
        assert.equal(1, code, ctx(gw, out))
        assert.matches("reload refused: .-ricochet%.conf:%d+: bind%(%) to 127%.0%.0%.1:" .. port .. " failed", out)
        assert.matches("generation 1 keeps serving", out)
        assert.equal("one", generation(gw, up), ctx(gw))
    end)

    it("moves the error log when the new config names another one", function()
        local moved = CONF:gsub("error_log logs/error%.log info;", "error_log logs/second.log info;")
        local code, out = gw:reload(moved, { GEN = "two" })
        assert.equal(0, code, ctx(gw, out))
        local second = gw.prefix .. "/logs/second.log"
        assert.matches("configuration generation 2 serving", H.read_file(second) or "")
        H.raw(gw.port, "BAD\r\n\r\n") -- a new worker logs it in the new file
        assert.truthy(H.wait_until(function() return (H.read_file(second) or ""):find("invalid request") end, 10),
            ctx(gw))
    end)

    it("keeps a key stored before the reload: the repeat after it is replayed", function()
        local key = "reload-" .. os.time() .. "-" .. math.random(1e6)
        local first = assert(H.request(gw.port, { method = "POST", path = "/pay", body = "x",
            headers = { ["Idempotency-Key"] = key } }))
        assert.equal(200, first.status, ctx(gw))
        local code, out = gw:reload(CONF, { GEN = "two" })
        assert.equal(0, code, ctx(gw, out))
        up:reset()
        local again = assert(H.request(gw.port, { method = "POST", path = "/pay", body = "x",
            headers = { ["Idempotency-Key"] = key } }))
        assert.equal(200, again.status, ctx(gw))
        assert.equal("true", again.headers["idempotent-replayed"], ctx(gw))
        assert.equal(0, #up:hits())
    end)

    it("loses no request of keep-alive clients across ten reloads of two configs", function()
        -- four keep-alive clients ask in turn while a shell reloads ten times, alternating
        local conns = {}
        for i = 1, 4 do conns[i] = assert(H.connect(gw.port)) end
        local other = gw.conf_path .. ".two"
        H.write_file(other, gw:render(CONF, { GEN = "two" }))
        local first = gw.conf_path .. ".one"
        H.write_file(first, gw:render(CONF, { GEN = "one" }))
        local done = gw.prefix .. "/reloads.done"
        local bin = H.shell_quote(gw.argv[1])
        local script = ("for i in 1 2 3 4 5 6 7 8 9 10; do "
            .. "if [ $((i %% 2)) = 1 ]; then cp %s %s; else cp %s %s; fi; "
            .. "%s -p %s -c %s -s reload >> %s 2>&1 || echo FAILED >> %s; sleep 0.1; done; touch %s")
            :format(H.shell_quote(other), H.shell_quote(gw.conf_path), H.shell_quote(first),
                H.shell_quote(gw.conf_path), bin, H.shell_quote(gw.prefix), H.shell_quote(gw.conf_path),
                H.shell_quote(gw.prefix .. "/reloads.log"), H.shell_quote(gw.prefix .. "/reloads.log"),
                H.shell_quote(done))
        os.execute("(" .. script .. ") > /dev/null 2>&1 &")
        local sent, failed, reconnects = 0, {}, 0
        local deadline = socket.gettime() + 60
        while socket.gettime() < deadline do
            for i = 1, #conns do
                local r, err = conns[i]:request({ path = "/load/" .. sent, timeout = 10 })
                sent = sent + 1
                if not r then
                    failed[#failed + 1] = tostring(err)
                elseif r.status ~= 200 then
                    failed[#failed + 1] = "status " .. r.status
                end
                if not r or (r.headers["connection"] or ""):lower() == "close" then
                    -- the old generation answered and closed, as it must: a new connection goes on
                    conns[i]:close()
                    conns[i] = assert(H.connect(gw.port))
                    reconnects = reconnects + 1
                end
            end
            if H.read_file(done) then break end
        end
        for i = 1, #conns do conns[i]:close() end
        local log = H.read_file(gw.prefix .. "/reloads.log") or ""
        assert.truthy(H.read_file(done), "the reloads did not finish in time\n" .. log)
        assert.equal(0, #failed, table.concat(failed, "\n") .. "\n" .. ctx(gw, log))
        assert.is_nil(log:find("FAILED"), log)
        local _, served = log:gsub("generation %d+ serving", "")
        assert.equal(10, served, log)
        assert.truthy(sent > 40, "only " .. sent .. " requests")
        assert.truthy(reconnects >= 4, "the old generations never closed a connection")
        -- ten reloads from "one": the last was "one" again (even counts copy the first)
        assert.equal("one", generation(gw, up), ctx(gw))
    end)
end)

describe("ricochet -s reload without a master", function()
    it("says the pid file is stale", function()
        local dir = H.mkdtemp("nomaster")
        local conf = dir .. "/ricochet.conf"
        H.write_file(conf, "pid " .. dir .. "/ricochet.pid;\nhttp { server { listen 127.0.0.1:9; } }\n")
        H.write_file(dir .. "/ricochet.pid", "999999\n")
        local code, out = H.run({ H.bin(), "-p", dir, "-c", conf, "-s", "reload" })
        H.rm_rf(dir)
        assert.equal(1, code, out)
        assert.matches("no master runs", out)
    end)
end)

-- Everything a reload reads again: a route's script, an upstream's servers, a retry policy.
local CHANGING = [[
worker_processes 1;
error_log logs/error.log info;
pid logs/ricochet.pid;
http {
    # far above what these hooks take, however busy the machine (the bound counts wall time);
    # script_bounds_spec tests the bound
    script_timeout 1s;
    access_log logs/access.log;
    upstream up { server {{SERVER}}; retry_budget off; }
    server {
        listen 127.0.0.1:{{PORT}};
        retry_backoff 1ms 2ms;
        location / {
            script {{SDIR}}/route.lua;
            retry_attempts {{ATTEMPTS}};
            proxy_pass http://up;
        }
    }
}
]]

local function script(word)
    return ("local route = {}\nfunction route.on_request(req) req:set_header(\"X-Script\", %q) end\nreturn route\n")
        :format(word)
end

describe("a reload that changes a script, an upstream's servers and a retry policy", function()
    local a, b, gw

    local sdir

    setup(function()
        a, b = H.start_upstream(), H.start_upstream()
        sdir = H.mkdtemp("scripts")
        H.write_file(sdir .. "/route.lua", script("v1"))
        gw = H.start_gateway({ conf = CHANGING, vars = { SDIR = sdir, SERVER = "127.0.0.1:" .. a.port, ATTEMPTS = 1 } })
    end)

    teardown(function()
        if gw then gw:stop() end
        if a then a:stop() end
        if b then b:stop() end
        if sdir then H.rm_rf(sdir) end
    end)

    it("shows each change on the next request", function()
        a:program({ default = { status = 503, body = "busy" } })
        b:program({ default = { status = 503, body = "busy" } })
        local r = assert(H.request(gw.port, { path = "/x" }))
        assert.equal(503, r.status, gw:log())
        local hits = a:hits()
        assert.equal(1, #hits, gw:log()) -- retry_attempts 1
        assert.equal("v1", H.hit_values(hits[1], "x-script")[1])
        a:reset()
        H.write_file(sdir .. "/route.lua", script("v2"))
        local code, out = gw:reload(CHANGING, { SERVER = "127.0.0.1:" .. b.port, ATTEMPTS = 3 })
        assert.equal(0, code, out .. gw:log())
        r = assert(H.request(gw.port, { path = "/x" }))
        assert.equal(503, r.status)
        assert.equal(0, #a:hits(), "the old server was asked")
        hits = b:hits()
        assert.equal(3, #hits, gw:log()) -- retry_attempts 3, to the new server
        for _, h in ipairs(hits) do assert.equal("v2", H.hit_values(h, "x-script")[1]) end
    end)
end)

-- /proc/PID/status VmRSS, in KiB.
local rss_kib = H.rss_kib

describe("fifty reloads", function()
    it("leave the master's memory, and a new worker's, where ten left them", function()
        local up = H.start_upstream()
        up:program({ default = { status = 200, body = "ok" } })
        local dir = H.mkdtemp("rss")
        H.write_file(dir .. "/route.lua", script("rss"))
        local conf = CONF:gsub("proxy_set_header X%-Generation {{GEN}};",
            "proxy_set_header X-Generation {{GEN}};\n            script " .. dir .. "/route.lua;")
        local gw = H.start_gateway({ conf = conf, upstream = up, vars = { GEN = "0" } })
        -- a worker of the generation just made, once the old ones left and it served: not one still starting
        -- or draining, whose memory depends on how far a busy machine let it get
        local function new_worker_rss(old)
            local now = H.wait_until(function()
                local w = gw:workers()
                for _, p in ipairs(w) do
                    for _, o in ipairs(old) do if p == o then return nil end end
                end
                return #w == 2 and w
            end, 30)
            if not now then return nil end
            for k = 1, 4 do H.request(gw.port, { path = "/warm/" .. k, headers = { { "Connection", "close" } } }) end
            return rss_kib(now[1])
        end
        local after10, worker10, old
        for i = 1, 50 do
            old = gw:workers()
            local code, out = gw:reload(conf, { GEN = tostring(i) })
            if code ~= 0 then
                gw:stop(); up:stop(); H.rm_rf(dir)
                error("reload " .. i .. " failed: " .. out)
            end
            if i == 10 then
                after10 = rss_kib(gw.pid)
                worker10 = new_worker_rss(old)
            end
        end
        local after50 = rss_kib(gw.pid)
        local worker50 = new_worker_rss(old)
        local r = H.request(gw.port, { path = "/after" })
        gw:stop()
        up:stop()
        H.rm_rf(dir)
        assert.truthy(r and r.status == 200)
        assert.truthy(after10 and after50)
        if os.getenv("RICOCHET_SANITIZED") == "1" then
            return -- AddressSanitizer keeps freed memory in quarantine; its leak check runs at exit
        end
        -- forty more reloads grow it by less than 1 MiB (a leaked Lua state or TLS context is more)
        assert.truthy(after50 - after10 < 1024, ("RSS %d KiB after 10 reloads, %d KiB after 50"):format(after10, after50))
        -- a worker of the 50th generation is no larger than one of the 10th
        assert.truthy(worker10 and worker50 and worker50 - worker10 < 1024,
            ("a worker's RSS %s KiB after 10 reloads, %s KiB after 50"):format(tostring(worker10), tostring(worker50)))
    end)
end)

-- A budget's state lives in the shared zone by upstream and rule: a reload that keeps the rule keeps it.
local BUDGET = [[
worker_processes 1;
error_log logs/error.log info;
pid logs/ricochet.pid;
http {
    access_log logs/access.log;
    upstream up { server {{UPSTREAM}}; retry_budget adaptive max={{MAX}} wait=0s; }
    server {
        listen 127.0.0.1:{{PORT}};
        retry_backoff 1ms 2ms;
        retry_attempts 5;
        location / { proxy_pass http://up; proxy_set_header X-Round {{ROUND}}; }
    }
}
]]

describe("a retry budget across a reload", function()
    it("stays drained when its rule is unchanged, and starts afresh when the rule changes", function()
        local up = H.start_upstream()
        up:program({ default = { status = 503, body = "down" } })
        local gw = H.start_gateway({ conf = BUDGET, upstream = up, vars = { MAX = 2, ROUND = 1 } })
        local function attempts()
            up:reset()
            up:program({ default = { status = 503, body = "down" } })
            local r = H.request(gw.port, { path = "/b" })
            assert.equal(503, r and r.status, gw:log())
            return #up:hits()
        end
        local ok, err = pcall(function()
            assert.equal(3, attempts(), gw:log()) -- two tokens: two retries
            assert.equal(1, attempts(), gw:log()) -- drained: no retry
            local code, out = gw:reload(BUDGET, { MAX = 2, ROUND = 2 })
            assert.equal(0, code, out)
            assert.equal(1, attempts(), gw:log()) -- the same rule: still drained
            code, out = gw:reload(BUDGET, { MAX = 3, ROUND = 3 })
            assert.equal(0, code, out)
            assert.equal(4, attempts(), gw:log()) -- a new rule: a full bucket of three
        end)
        gw:stop()
        up:stop()
        assert(ok, err)
    end)
end)

-- A binary upgrade: the binary on disk runs as a new master with the old one's sockets; once its
-- workers serve, the old master drains and exits. The gateway runs from a copy, which the test replaces.
describe("a binary upgrade (-s upgrade)", function()
    local up, gw, bindir

    local function pid_in_file()
        return tonumber(H.read_file(gw.prefix .. "/logs/ricochet.pid") or "")
    end

    local function upgrade()
        gw:wait_pid_file()
        return H.run({ H.bin(), "-p", gw.prefix, "-c", gw.conf_path, "-s", "upgrade" }, { timeout = 70 })
    end

    before_each(function()
        up = H.start_upstream()
        up:program({ default = { status = 200, body = "ok" } })
        bindir = H.mkdtemp("bin")
        assert(os.execute("cp " .. H.shell_quote(H.bin()) .. " " .. H.shell_quote(bindir .. "/ricochet")))
        gw = H.start_gateway({ conf = CONF, upstream = up, vars = { GEN = "one" }, bin = bindir .. "/ricochet" })
    end)

    after_each(function()
        local pid = pid_in_file()
        if gw then gw:stop() end
        if pid and pid ~= gw.pid then
            -- the new master outlives the old one: stopped through its pid file
            os.execute("kill -TERM " .. pid .. " 2>/dev/null")
            H.wait_until(function() return not H.read_file("/proc/" .. pid .. "/status") end, 10)
            os.execute("kill -KILL " .. pid .. " 2>/dev/null")
        end
        if up then up:stop() end
        H.rm_rf(bindir)
    end)

    it("hands the sockets to the new binary without losing a keep-alive client's request", function()
        local conns = {}
        for i = 1, 4 do conns[i] = assert(H.connect(gw.port)) end
        local done, log = gw.prefix .. "/upgrade.done", gw.prefix .. "/upgrade.log"
        os.execute(("(sleep 0.3; %s -p %s -c %s -s upgrade > %s 2>&1; echo rc=$? >> %s; touch %s) > /dev/null 2>&1 &")
            :format(H.shell_quote(H.bin()), H.shell_quote(gw.prefix), H.shell_quote(gw.conf_path),
                H.shell_quote(log), H.shell_quote(log), H.shell_quote(done)))
        local sent, failed = 0, {}
        local deadline = socket.gettime() + 60
        local settle -- a little load after the upgrade is over, on the new master alone
        while socket.gettime() < deadline do
            for i = 1, #conns do
                local r, err = conns[i]:request({ path = "/up/" .. sent, timeout = 10 })
                sent = sent + 1
                if not r then failed[#failed + 1] = tostring(err)
                elseif r.status ~= 200 then failed[#failed + 1] = "status " .. r.status end
                if not r or (r.headers["connection"] or ""):lower() == "close" then
                    conns[i]:close()
                    conns[i] = assert(H.connect(gw.port))
                end
            end
            if H.read_file(done) then
                settle = settle or socket.gettime() + 1.5
                if socket.gettime() > settle then break end
            end
        end
        for i = 1, #conns do conns[i]:close() end
        local out = H.read_file(log) or ""
        assert.truthy(H.read_file(done), "the upgrade did not finish\n" .. out)
        assert.matches("rc=0", out, out .. ctx(gw))
        assert.matches("upgraded: the new binary's master %d+ serves", out)
        assert.equal(0, #failed, table.concat(failed, "\n") .. "\n" .. ctx(gw, out))
        local new = pid_in_file()
        assert.truthy(new and new ~= gw.pid, "the pid file still names the old master")
        assert.truthy(gw:wait_exit(30), "the old master did not exit")
        local r = H.request(gw.port, { path = "/after" })
        assert.equal(200, r and r.status)
    end)

    it("tells systemd (NOTIFY_SOCKET) when it serves, reloads, and which master serves after an upgrade", function()
        gw:stop()
        local unix = require("socket.unix")
        local path = bindir .. "/notify.sock"
        local sock = assert(unix.dgram())
        assert(sock:bind(path))
        sock:settimeout(10)
        gw = H.start_gateway({ conf = CONF, upstream = up, vars = { GEN = "one" }, bin = bindir .. "/ricochet",
            env = { NOTIFY_SOCKET = path } })
        -- what the master sends, until one message has want (bounded)
        local function heard(want)
            local all = {}
            for _ = 1, 20 do
                local msg = sock:receive()
                if not msg then break end
                all[#all + 1] = msg
                if msg:find(want) then return msg end
            end
            error("no \"" .. want .. "\" in: " .. table.concat(all, " | "))
        end
        local ok, err = pcall(function()
            assert.matches("MAINPID=" .. gw.pid, heard("READY=1"))
            local code, out = gw:reload(CONF, { GEN = "two" })
            assert.equal(0, code, out)
            heard("RELOADING=1")
            assert.matches("generation 2 serving", heard("READY=1"))
            code, out = upgrade()
            assert.equal(0, code, out)
            local new = pid_in_file()
            assert.truthy(new and new ~= gw.pid)
            assert.matches("MAINPID=" .. new, heard("MAINPID="))
        end)
        sock:close()
        os.remove(path)
        assert(ok, err)
    end)

    it("keeps serving, and says why, when the new binary does not start", function()
        local broken = bindir .. "/ricochet.new"
        H.write_file(broken, "#!/bin/sh\nexit 3\n")
        assert(os.execute("chmod +x " .. H.shell_quote(broken) .. " && mv " .. H.shell_quote(broken) .. " "
            .. H.shell_quote(bindir .. "/ricochet")))
        local code, out = upgrade()
        assert.equal(1, code, out .. ctx(gw))
        assert.matches("upgrade failed: the new binary's master %d+ exited with code 3", out)
        assert.equal(gw.pid, pid_in_file())
        local r = H.request(gw.port, { path = "/still" })
        assert.equal(200, r and r.status, ctx(gw))
        -- and a reload still works afterwards (asked by a binary that runs)
        local rc, rout = H.run({ H.bin(), "-p", gw.prefix, "-c", gw.conf_path, "-s", "reload" }, { timeout = 70 })
        assert.equal(0, rc, rout .. ctx(gw))
    end)
end)
