-- JSON cannot hang or bloat a worker (issue 33, item 4): the settings that made lua-cjson loop for ever or
-- recurse without end are refused, an encode or decode that runs into script_memory_max is stopped and its
-- memory given back, a loop of calls is stopped by script_timeout, and ordinary JSON still works. One worker:
-- after each attack the same worker answers an ordinary request with the right answer.
package.path = "tests/e2e/?.lua;" .. package.path
local H = require("helpers")

local ctx = H.context

local rss_kb = H.rss_kib

local sanitized = H.sanitized

local SCRIPT = [[
local cjson = require("cjson")
local safe = require("cjson.safe")
local attacks = {}
-- the settings that made lua-cjson 2.1.0 loop for ever (an int array length overflowed) or recurse
attacks["/sparse-off"] = function()
    cjson.encode_sparse_array(false, 0, 0)
    return cjson.encode({ [2 ^ 31 - 1] = 1 })
end
attacks["/sparse-safe"] = function()
    local c = cjson.new()
    c.encode_sparse_array(false, 2, 2 ^ 31 - 1)
    return c.encode({ [2 ^ 31 - 1] = true, [1] = true })
end
attacks["/sparse-index"] = function()
    local c = cjson.new()
    c.encode_sparse_array(true, 0, 0)
    return c.encode({ [2 ^ 24 + 1] = 1 })
end
attacks["/decode-depth"] = function()
    cjson.decode_max_depth(2 ^ 31 - 1)
    return cjson.decode(("["):rep(200000))
end
attacks["/decode-deep"] = function()
    return cjson.decode(("["):rep(200000))
end
attacks["/encode-depth"] = function()
    local c = cjson.new()
    pcall(c.encode_max_depth, 1e9)
    local t = {}
    t[1] = t
    return c.encode(t)
end
-- output far larger than the state: one 1 MiB string named 200 times
attacks["/encode-many"] = function()
    local big = ("x"):rep(1048576)
    local t = {}
    for i = 1, 200 do t[i] = big end
    return cjson.encode(t)
end
attacks["/encode-many-safe"] = function()
    local big = ("y"):rep(1048576)
    local t = {}
    for i = 1, 200 do t[i] = big end
    local s, err = safe.encode(t)
    req_seen = { s, err } -- never reached: a memory stop is no nil, message
end
-- 15 MiB of text that decodes to far more than the state may hold
attacks["/decode-big"] = function()
    return cjson.decode("[" .. ('{"a":[1,2]},'):rep(1300000) .. "1]")
end
-- loops of calls, each untimed C in lua-cjson
attacks["/decode-loop"] = function()
    local text = "[" .. ("1,"):rep(100000) .. "1]"
    while true do cjson.decode(text) end
end
attacks["/safe-decode-loop"] = function()
    local text = "[" .. ("1,"):rep(100000) .. "1]"
    while true do safe.decode(text) end
end
attacks["/encode-loop"] = function()
    local t = {}
    for i = 1, 100000 do t[i] = i end
    while true do pcall(cjson.encode, t) end
end
-- one call whose output doubles with each level: only the clock ends it
attacks["/encode-doubling"] = function()
    local t = { "x" }
    for _ = 1, 40 do t = { t, t } end
    return cjson.encode(t)
end

local route = {}
function route.on_request(req)
    local attack = attacks[req.path]
    if attack then attack() end
    if req.path == "/ordinary" then
        local body = req:json()
        local bad, err = safe.decode("{")
        req:set_header("X-Json", cjson.encode({ body.list, body.none == cjson.null, bad == nil, err }))
        req:set_header("X-Depth", tostring(cjson.decode_max_depth()) .. " " .. tostring(cjson.encode_sparse_array()))
    end
    req:set_header("X-Script-Ran", "yes")
end
return route
]]

local CONF = [[
worker_processes 1;
error_log logs/error.log info;
http {
    {{BOUNDS}}
    upstream up { server {{UPSTREAM}}; retry_budget off; }
    server {
        listen 127.0.0.1:{{PORT}};
        location / { script {{SCRIPT}}; retry_body_max 64k; proxy_pass http://up; }
    }
}
]]

local sdir = H.mkdtemp("json")

-- A gateway with one worker and the given bounds; attack(path) sends the hostile request, checks the
-- built-in policy answered it and the same worker then answers an ordinary request, and returns the log
-- lines the attack added.
local function gateway(bounds)
    local g = {}
    g.up = H.start_upstream()
    g.gw = H.start_gateway({ conf = CONF, upstream = g.up, vars = { SCRIPT = sdir .. "/json.lua", BOUNDS = bounds } })
    local r = assert(H.request(g.gw.port, { method = "GET", path = "/warm" }))
    assert(r.status == 200, ctx(g.gw))
    g.worker = g.gw:workers()[1]
    function g.attack(path)
        local gw, up = g.gw, g.up
        local before = #gw:log()
        up:reset()
        local res = H.request(gw.port, { method = "GET", path = path, timeout = 20 })
        assert.truthy(res, "no answer to " .. path .. "\n" .. ctx(gw))
        assert.equal(200, res.status, ctx(gw, path))
        local hits = up:hits()
        assert.equal(1, #hits, ctx(gw, path))
        assert.same({}, H.hit_values(hits[1], "X-Script-Ran"), ctx(gw, path .. ": the hook went on"))
        assert.same({ g.worker }, gw:workers(), ctx(gw, path .. ": the worker changed"))
        up:reset()
        local again = assert(H.request(gw.port, { method = "GET", path = "/fine" }))
        assert.equal(200, again.status)
        assert.same({ "yes" }, H.hit_values(up:hits()[1], "X-Script-Ran"), path)
        return gw:log():sub(before + 1)
    end
    function g.stop()
        g.gw:stop()
        g.up:stop()
    end
    return g
end

describe("JSON in a route script, under script_memory_max", function()
    local g

    setup(function()
        H.write_file(sdir .. "/json.lua", SCRIPT)
        -- a long time bound: only the memory bound (or a refusal) can end these calls
        g = gateway("script_timeout 30s;")
    end)

    teardown(function()
        if g then g.stop() end
    end)

    it("still decodes and encodes ordinary values as lua-cjson does", function()
        g.up:reset()
        local r = assert(H.request(g.gw.port, { method = "POST", path = "/ordinary",
            headers = { ["Content-Type"] = "application/json" },
            body = '{"list":[1,2.5,"a/b\\u00e9",true,{"k":[]},1e300],"none":null}' }))
        assert.equal(200, r.status, ctx(g.gw))
        local hit = g.up:hits()[1]
        assert.same({ '[[1,2.5,"a\\/b\195\169",true,{"k":{}},1e+300],true,true,'
            .. '"Expected object key string but found T_END at character 2"]' },
            H.hit_values(hit, "X-Json"), ctx(g.gw))
        assert.same({ "1000 false" }, H.hit_values(hit, "X-Depth"), ctx(g.gw))
    end)

    it("refuses the sparse-array settings that made lua-cjson loop for ever", function()
        local log = g.attack("/sparse-off")
        assert.truthy(log:find("Cannot serialise table: array index 2147483647 is over 16777216", 1, true),
            ctx(g.gw))
        log = g.attack("/sparse-safe")
        assert.truthy(log:find("array index 2147483647 is over 16777216", 1, true), ctx(g.gw))
        log = g.attack("/sparse-index")
        assert.truthy(log:find("array index 16777217 is over 16777216", 1, true), ctx(g.gw))
    end)

    it("refuses nesting deeper than 1000, whatever depth a script sets", function()
        local log = g.attack("/decode-depth")
        assert.truthy(log:find("bad argument #1 to 'decode_max_depth' (expected integer between 1 and 1000)",
            1, true), ctx(g.gw))
        log = g.attack("/decode-deep")
        assert.truthy(log:find("Found too many nested data structures (1001) at character 1001", 1, true),
            ctx(g.gw))
        log = g.attack("/encode-depth")
        assert.truthy(log:find("Cannot serialise, excessive nesting (1001)", 1, true), ctx(g.gw))
    end)

    it("stops an encode or decode that runs into the bound, and gives the memory back", function()
        local base = assert(rss_kb(g.worker))
        for _, path in ipairs({ "/encode-many", "/encode-many-safe", "/decode-big", "/encode-many" }) do
            local log = g.attack(path)
            assert.truthy(log:find("stopped: it used more memory than script_memory_max allows", 1, true),
                ctx(g.gw, path))
        end
        local after = assert(rss_kb(g.worker))
        if not sanitized() then
            assert.truthy(after - base < 10 * 1024, ("worker RSS %d KiB before, %d KiB after"):format(base, after))
        end
    end)
end)

describe("JSON in a route script, under script_timeout", function()
    local g

    setup(function()
        H.write_file(sdir .. "/json.lua", SCRIPT)
        -- a bound on memory no call here can reach: only the clock can stop them
        g = gateway("script_timeout 20ms; script_memory_max 2g;")
    end)

    teardown(function()
        if g then g.stop() end
        H.rm_rf(sdir)
    end)

    for _, path in ipairs({ "/decode-loop", "/safe-decode-loop", "/encode-loop", "/encode-doubling" }) do
        it("stops " .. path .. " at the time bound", function()
            local log = g.attack(path)
            assert.truthy(log:find("stopped: it ran longer than a hook may", 1, true), ctx(g.gw, path))
            assert.is_nil(log:find("script_memory_max", 1, true), ctx(g.gw, path))
        end)
    end
end)
