-- Route scripts that attack their own bounds (issue 20, finding 1, 4 and 5): a runaway through xpcall's
-- handler, recursion through gsub/sort/tostring callbacks, memory bombs and long library scans. Each must
-- be stopped with a logged error, the request answered by the built-in policy, the worker unchanged (same
-- PID) and its memory back near where it was; the real binary, one worker, the fault upstream.
package.path = "tests/e2e/?.lua;" .. package.path
local H = require("helpers")

local ctx = H.context

local HOSTILE = [[
local route = {}
local attacks = {}
attacks["/xpcall"] = function()
    xpcall(function() while true do end end, function() while true do end end)
end
attacks["/pcall-loop"] = function()
    while true do pcall(function() while true do end end) end
end
attacks["/gsub"] = function()
    local function f() return (("x"):gsub("x", f)) end
    f()
end
attacks["/sort"] = function()
    local function cmp(a, b) table.sort({ 3, 2, 1 }, cmp) return a < b end
    table.sort({ 5, 4, 3, 2, 1 }, cmp)
end
attacks["/tostring"] = function()
    local t = setmetatable({}, { __tostring = function(self) return tostring(self) end })
    tostring(t)
end
attacks["/rep-string-count"] = function() return string.rep("x", "1073741824") end
attacks["/rep-number"] = function() return string.rep(1234567890, 107374183) end
attacks["/concat"] = function()
    local s = ("x"):rep(16000000)
    for _ = 1, 6 do s = s .. s end
    return s
end
attacks["/pcall-memory"] = function()
    -- the refused allocation caught, then on as if nothing happened: still a stop
    pcall(function()
        local s = ("x"):rep(16000000)
        for _ = 1, 6 do s = s .. s end
        return s
    end)
end
attacks["/keep"] = function()
    -- 4 MB at once: past half of the bound within a dozen steps, whatever the time bound says
    kept = kept or {}
    for i = 1, 1000 do kept[#kept + 1] = ("y"):rep(4000000) .. i end
end
attacks["/find"] = function()
    local s = ("x"):rep(16000000)
    for _ = 1, 200 do s:find("[q]") end
end
function route.on_request(req)
    local attack = attacks[req.path]
    if attack then attack() end
    req:set_header("X-Script-Ran", require("tag"))
end
return route
]]

local LOOPING_MAIN = [[
xpcall(function() while true do end end, function() while true do end end)
return {}
]]

-- Two bounds, never raced: the time attacks run under the default script_timeout (50ms) and allocate
-- nothing near script_memory_max; the memory attacks run under a script_timeout of 60s, 1,200 times
-- the default, so only the memory bound can stop them however slow or busy the machine is (a stop by
-- time would leave /keep's table below half the bound, and its state would not be made again).
local CONF = [[
worker_processes 1;
error_log logs/error.log info;
http {
    {{TIMEOUT}}
    upstream up { server {{UPSTREAM}}; retry_budget off; }
    server {
        listen 127.0.0.1:{{PORT}};
        location / { script {{SCRIPT}}; proxy_pass http://up; }
    }
}
]]

local sdir = H.mkdtemp("bounds")

local rss_kb = H.rss_kib

local TIME_BOUND = { SCRIPT = sdir .. "/hostile.lua", TIMEOUT = "" }
local MEMORY_BOUND = { SCRIPT = sdir .. "/hostile.lua", TIMEOUT = "script_timeout 60s;" }

describe("a hostile route script", function()
    local up, gw, worker, gwm, worker_m

    setup(function()
        up = H.start_upstream()
        H.write_file(sdir .. "/hostile.lua", HOSTILE)
        H.write_file(sdir .. "/tag.lua", 'return "yes"\n')
        gw = H.start_gateway({ conf = CONF, upstream = up, vars = TIME_BOUND })
        local r = assert(H.request(gw.port, { method = "GET", path = "/warm" }))
        assert(r.status == 200, ctx(gw))
        worker = gw:workers()[1]
        gwm = H.start_gateway({ conf = CONF, upstream = up, vars = MEMORY_BOUND })
        r = assert(H.request(gwm.port, { method = "GET", path = "/warm" }))
        assert(r.status == 200, ctx(gwm))
        worker_m = gwm:workers()[1]
    end)

    teardown(function()
        if gw then gw:stop() end
        if gwm then gwm:stop() end
        if up then up:stop() end
        H.rm_rf(sdir)
    end)

    before_each(function() up:reset() end)

    -- path against the time-bound gateway, or the memory-bound one when memory is true
    local function attack(path, memory)
        local gw, worker = gw, worker -- luacheck: ignore 431
        if memory then gw, worker = gwm, worker_m end
        up:reset()
        local r = H.request(gw.port, { method = "GET", path = path, timeout = 20 })
        assert.truthy(r, "no answer to " .. path .. "\n" .. ctx(gw))
        -- the built-in policy answered: the request went upstream without the script's header
        assert.equal(200, r.status, ctx(gw, path))
        local hits = up:hits()
        assert.equal(1, #hits, ctx(gw, path))
        assert.same({}, H.hit_values(hits[1], "X-Script-Ran"), path)
        -- the same worker serves the next request, and the script runs again
        assert.same({ worker }, gw:workers(), ctx(gw, path .. ": the worker changed"))
        up:reset()
        local again = assert(H.request(gw.port, { method = "GET", path = "/fine" }))
        assert.equal(200, again.status)
        assert.same({ "yes" }, H.hit_values(up:hits()[1], "X-Script-Ran"), path)
        return r
    end

    for _, case in ipairs({
        { "/xpcall", "stopped: it ran longer than a hook may" },
        { "/pcall-loop", "stopped: it ran longer than a hook may" },
        { "/find", "stopped: it ran longer than a hook may" },
    }) do
        it("stops a runaway through " .. case[1] .. " and keeps serving", function()
            local _, before = gw:log():gsub("of its on_request in every worker since start", "")
            attack(case[1])
            assert.truthy(gw:log():find(case[2], 1, true), ctx(gw))
            -- counted in the shared zone: each stop names its number, one more than the last
            local last = 0
            for n in gw:log():gmatch("%(stop (%d+) of its on_request in every worker since start%)") do
                assert.equal(last + 1, tonumber(n), ctx(gw))
                last = tonumber(n)
            end
            assert.equal(before + 1, last, ctx(gw))
        end)
    end

    for _, path in ipairs({ "/gsub", "/sort", "/tostring" }) do
        it("ends recursion through " .. path .. " callbacks with an error, never a crash", function()
            attack(path)
            assert.is_nil(gw:log():find("exited on signal", 1, true), ctx(gw))
            assert.truthy(gw:log():find("on_request failed", 1, true), ctx(gw))
        end)
    end

    it("refuses string.rep bombs whatever the types of its arguments", function()
        attack("/rep-string-count")
        attack("/rep-number")
        local _, n = gw:log():gsub("string.rep: a result over 16 MiB", "")
        assert.equal(2, n, ctx(gw))
    end)

    it("stops memory bombs at script_memory_max and gives the memory back", function()
        local base = assert(rss_kb(worker_m))
        attack("/concat", true)
        attack("/keep", true)
        assert.truthy(gwm:log():find("was made again", 1, true), ctx(gwm, "/keep kept more than half"))
        attack("/concat", true)
        local _, before = gwm:log():gsub("more memory than script_memory_max allows", "")
        attack("/pcall-memory", true)
        local _, after_stops = gwm:log():gsub("more memory than script_memory_max allows", "")
        assert.equal(before + 1, after_stops, ctx(gwm, "a caught refusal still stops the call"))
        assert.equal(3, before, ctx(gwm, "each bomb stopped by memory, none by time"))
        assert.is_nil(gwm:log():find("ran longer than a hook may", 1, true), ctx(gwm))
        local after = assert(rss_kb(worker_m))
        if not H.sanitized() then
            assert.truthy(after - base < 10 * 1024, ("worker RSS %d KiB before, %d KiB after"):format(base, after))
        end
    end)
end)

describe("a refused allocation caught with pcall", function()
    it("still stops the call: the hook does not go on", function()
        local up = H.start_upstream()
        local dir = H.mkdtemp("caught")
        local script = dir .. "/caught.lua"
        H.write_file(script, [=[
return { on_request = function(req)
    local ok, e = pcall(function() local s = ("x"):rep(16000000) for _ = 1, 6 do s = s .. s end return s end)
    req:set_header("X-Caught", tostring(ok) .. " " .. tostring(e))
end }
]=])
        local gw = H.start_gateway({ conf = CONF, upstream = up,
            vars = { SCRIPT = script, TIMEOUT = MEMORY_BOUND.TIMEOUT } })
        local ok, err = pcall(function()
            local r = assert(H.request(gw.port, { method = "GET", path = "/x", timeout = 20 }))
            assert.equal(200, r.status)
            assert.same({}, H.hit_values(up:hits()[1], "X-Caught"), ctx(gw))
            assert.truthy(gw:log():find("on_request failed (the built-in policy decides): stopped: it used "
                .. "more memory than script_memory_max allows", 1, true), ctx(gw))
        end)
        gw:stop()
        up:stop()
        H.rm_rf(dir)
        assert(ok, err)
    end)
end)

describe("a state made again", function()
    it("runs the text its script had at start, not the file as edited since", function()
        local up = H.start_upstream()
        local dir = H.mkdtemp("edit")
        H.write_file(dir .. "/hostile.lua", HOSTILE)
        H.write_file(dir .. "/tag.lua", 'return "yes"\n')
        local gw = H.start_gateway({ conf = CONF, upstream = up,
            vars = { SCRIPT = dir .. "/hostile.lua", TIMEOUT = MEMORY_BOUND.TIMEOUT } })
        local ok, err = pcall(function()
            assert(H.request(gw.port, { method = "GET", path = "/warm" }))
            -- both files change on disk; a reload, not a rebuild, is how new text is taken
            H.write_file(dir .. "/hostile.lua", "return { on_request = function(req) "
                .. "req:set_header('X-Script-Ran', 'edited') end }\n")
            H.write_file(dir .. "/tag.lua", 'return "edited"\n')
            assert(H.request(gw.port, { method = "GET", path = "/keep", timeout = 20 }))
            assert.truthy(H.wait_until(function() return gw:log():find("was made again", 1, true) end, 5),
                ctx(gw))
            up:reset()
            local r = assert(H.request(gw.port, { method = "GET", path = "/fine" }))
            assert.equal(200, r.status)
            assert.same({ "yes" }, H.hit_values(up:hits()[1], "X-Script-Ran"), ctx(gw))
        end)
        gw:stop()
        up:stop()
        H.rm_rf(dir)
        assert(ok, err)
    end)
end)

describe("a main chunk that runs away", function()
    it("is stopped at -t with FILE:LINE, not hung", function()
        local dir = H.mkdtemp("main")
        H.write_file(dir .. "/main.lua", LOOPING_MAIN)
        local conf = dir .. "/main.conf"
        H.write_file(conf, "http { server { listen 127.0.0.1:1; location / { script " .. dir
            .. "/main.lua; proxy_pass http://127.0.0.1:2; } } }\n")
        local code, out = H.run({ H.bin(), "-t", "-c", conf }, { timeout = 20 })
        H.rm_rf(dir)
        assert.equal(1, code, out)
        assert.truthy(out:find("stopped: it ran longer than a hook may", 1, true), out)
        assert.truthy(out:find(conf .. ":1:", 1, true), out)
    end)
end)
