-- The worker watchdog (issue 33, item 6): a worker whose event loop has not turned for worker_watchdog is killed
-- by the master, logged with the script, hook and route it was in, counted in /metrics, and replaced; `off`
-- leaves a long hook alone; a reload that changes it applies to the workers of the old generation too.
--
-- The stall is a route script's own: script_timeout is 60s (the directive takes any time above 0), far above
-- the watchdog's 1s, and the hook scans an 8 MiB string again and again, a few Lua instructions per scan, so
-- neither the time bound nor the 10,000,000-instruction bound stops it within many seconds, whatever the
-- machine's speed. Nothing here compares two clocks: a stalled request's client either sees its connection
-- closed (the watchdog) or, after 60 s, an answer (no watchdog); the spec waits 20 s at most.
package.path = "tests/e2e/?.lua;" .. package.path
local H = require("helpers")

local ctx = H.context

local SCRIPT = [[
local route = {}
local big
function route.on_request(req)
    if req.path:find("/stall", 1, true) then
        big = big or ("x"):rep(8 * 1024 * 1024)
        ricochet.log("notice", "the stall begins")
        while true do big:find("q", 1, true) end -- until script_timeout (60s): far past the watchdog
    elseif req.path == "/long" then
        -- a fixed count of scans, seconds of work here, which ends by itself
        big = big or ("x"):rep(8 * 1024 * 1024)
        for _ = 1, {{SCANS}} do big:find("q", 1, true) end
    end
    req:set_header("X-Script-Ran", "yes")
end
return route
]]

local CONF = [[
worker_processes 1;
worker_watchdog {{WATCHDOG}};
error_log logs/error.log info;
pid logs/ricochet.pid;
http {
    script_timeout 60s;
    admin_listen 127.0.0.1:{{PORT2}};
    upstream up { server {{UPSTREAM}}; retry_budget off; }
    server {
        listen 127.0.0.1:{{PORT}};
        location /pay/ { script {{SCRIPT}}; proxy_pass http://up; }
        location / { script {{SCRIPT}}; proxy_pass http://up; }
    }
}
]]

local SCANS = 6000

local function kills(gw)
    local r = assert(H.request(gw.port2, { path = "/metrics", headers = { { "Connection", "close" } } }))
    assert.equal(200, r.status)
    return tonumber(r.body:match("\nricochet_worker_watchdog_kills_total (%d+)\n"))
end

-- An ordinary request, answered through the script by the upstream.
local function ordinary(gw, up)
    up:reset()
    local r = H.request(gw.port, { path = "/fine", timeout = 10 })
    assert.truthy(r, ctx(gw, "no answer to /fine"))
    assert.equal(200, r.status, ctx(gw))
    local hits = up:hits()
    assert.equal(1, #hits, ctx(gw))
    assert.same({ "yes" }, H.hit_values(hits[1], "X-Script-Ran"))
end

-- Sends a request that stalls its worker, and returns the connection once the hook has begun.
local function stall(gw, path)
    local conn = assert(H.connect(gw.port))
    assert(conn:send(H.build_request(gw.port, { path = path })))
    assert.truthy(H.wait_until(function() return gw:log():find("the stall begins", 1, true) end, 10),
        ctx(gw, "the stalling hook never began"))
    return conn
end

-- The stalled client's connection ends without an answer (the worker died with it).
local function cut(gw, conn)
    local resp, err = conn:read_response({ timeout = 20 })
    conn:close()
    assert.is_nil(resp, ctx(gw, "the stalled request was answered"))
    assert.is_not.equal("timeout", err, ctx(gw, "the stalled request's connection stayed open"))
end

describe("the worker watchdog", function()
    local up, gw, dir

    before_each(function()
        dir = H.mkdtemp("watchdog")
        up = H.start_upstream()
        up:program({ default = { status = 200, body = "ok" } })
    end)

    after_each(function()
        if gw then gw:stop() end
        gw = nil
        if up then up:stop() end
        H.rm_rf(dir)
    end)

    local function start(watchdog)
        local script = dir .. "/route.lua"
        H.write_file(script, (SCRIPT:gsub("{{SCANS}}", tostring(SCANS))))
        gw = H.start_gateway({ conf = CONF, upstream = up, vars = { SCRIPT = script, WATCHDOG = watchdog } })
        ordinary(gw, up)
        local workers = gw:workers()
        assert.equal(1, #workers)
        return workers[1], script
    end

    it("kills a worker stalled in a hook, names the script, hook and route, counts it and replaces it", function()
        local old, script = start("1s")
        assert.equal(0, kills(gw))
        cut(gw, stall(gw, "/pay/stall"))

        local line = H.wait_until(function()
            return gw:log():match("[^\n]*worker " .. old .. " stalled for [^\n]*")
        end, 10)
        assert.truthy(line, ctx(gw, "no watchdog line"))
        assert.truthy(line:find("[alert]", 1, true), line)
        assert.truthy(line:find(" in route script " .. script .. " on_request (route \"127.0.0.1:" .. gw.port
            .. " /pay/\"): killed by the watchdog (worker_watchdog 1s) and replaced; its requests in flight "
            .. "are lost; fix the script", 1, true), line)

        -- a new worker serves the next request, through the script, and the kill is counted once
        local new = H.wait_until(function()
            local w = gw:workers()
            return #w == 1 and w[1] ~= old and w[1] or nil
        end, 10)
        assert.truthy(new, ctx(gw, "no new worker"))
        ordinary(gw, up)
        assert.same({ new }, gw:workers())
        assert.equal(1, kills(gw))
        assert.truthy(gw:log():find("worker process " .. old .. " exited on signal 9", 1, true), ctx(gw))
    end)

    it("when off, leaves a long hook alone; a reload that turns it on watches the draining workers too", function()
        local old = start("off")
        up:reset()
        local r = H.request(gw.port, { path = "/long", timeout = 60 })
        assert.truthy(r, ctx(gw, "no answer to /long"))
        assert.equal(200, r.status, ctx(gw))
        assert.same({ "yes" }, H.hit_values(up:hits()[1], "X-Script-Ran"))
        assert.same({ old }, gw:workers(), ctx(gw, "the worker changed"))
        assert.is_nil(gw:log():find("stalled for", 1, true), ctx(gw))
        assert.equal(0, kills(gw))

        -- a worker stalls while the watchdog is off; a reload turns it on: the stalled worker, now of the old
        -- generation and draining, is killed by the new value, and not replaced (the new generation serves)
        local conn = stall(gw, "/stall")
        local code, out = gw:reload(CONF, { WATCHDOG = "1s" })
        assert.equal(0, code, ctx(gw, out))
        assert.truthy(out:find("generation 2 serving", 1, true), out)
        cut(gw, conn)
        local line = H.wait_until(function()
            return gw:log():match("[^\n]*worker " .. old .. " stalled for [^\n]*")
        end, 10)
        assert.truthy(line, ctx(gw, "no watchdog line"))
        assert.truthy(line:find(" on_request (route \"127.0.0.1:" .. gw.port .. " /\"): killed by the watchdog "
            .. "(worker_watchdog 1s); it was draining after a reload: not replaced", 1, true), line)
        ordinary(gw, up)
        local now = gw:workers()
        assert.equal(1, #now)
        assert.is_not.equal(old, now[1])
        assert.equal(1, kills(gw))
    end)

    it("refuses a watchdog under 1s, or not a time", function()
        for _, bad in ipairs({ "500ms", "0", "soon" }) do
            local conf = dir .. "/bad.conf"
            H.write_file(conf, "worker_watchdog " .. bad .. ";\n")
            local code, out = H.run({ H.bin(), "-t", "-c", conf })
            assert.equal(1, code, out)
            assert.truthy(out:find("invalid value \"" .. bad .. "\" in \"worker_watchdog\" directive, expected "
                .. "off or a time of at least 1s, like 5s", 1, true), out)
        end
    end)
end)
