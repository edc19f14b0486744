-- lua_shared_dict (issue 20, build item 4): ricochet.shared("NAME") is one dictionary for every worker,
-- atomic across them, kept while workers are replaced, with TTLs and LRU eviction when full; the real
-- binary, two workers, the fault upstream.
package.path = "tests/e2e/?.lua;" .. package.path
local H = require("helpers")

local ctx = H.context

local SCRIPT = [[
local counts = ricochet.shared("counts")
local small = ricochet.shared("small")
local route = {}
function route.on_request(req)
    local a = req:args()
    if req.path == "/count" then
        req:respond(200, {}, tostring(counts:incr("hits", 1, 0)))
    elseif req.path == "/set" then
        counts:set(a.k, a.v, tonumber(a.ttl))
        req:respond(200, {}, "ok")
    elseif req.path == "/get" then
        local v = counts:get(a.k)
        req:respond(200, {}, type(v) .. ":" .. tostring(v))
    elseif req.path == "/fill" then
        for i = 1, 2000 do small:set("k" .. i, ("v"):rep(100) .. i) end
        local first, last = small:get("k1"), small:get("k2000")
        req:respond(200, {}, tostring(first) .. "|" .. tostring(last ~= nil))
    elseif req.path == "/bad" then
        local ok1 = pcall(counts.set, counts, "k", {})
        local ok2 = pcall(counts.set, counts, ("x"):rep(65), 1)
        local ok3 = pcall(ricochet.shared, "undeclared")
        counts:set("s", "text")
        local ok4 = pcall(counts.incr, counts, "s", 1)
        local n, err = counts:incr("missing", 1)
        req:respond(200, {}, tostring(ok1) .. tostring(ok2) .. tostring(ok3) .. tostring(ok4) .. tostring(n) .. tostring(err))
    end
end
return route
]]

local CONF = [[
worker_processes 2;
error_log logs/error.log info;
http {
    lua_shared_dict counts 1m;
    lua_shared_dict small 16k;
    # /fill makes 2000 calls in one hook: a few ms, which a busy machine can stretch past the
    # 50ms default; the bound is not what these specs are about
    script_timeout 2s;
    upstream up { server {{UPSTREAM}}; }
    server {
        listen 127.0.0.1:{{PORT}};
        location / { script {{SCRIPT}}; proxy_pass http://up; }
    }
}
]]

local sdir = H.mkdtemp("shared")

describe("lua_shared_dict", function()
    local up, gw

    setup(function()
        up = H.start_upstream()
        H.write_file(sdir .. "/shared.lua", SCRIPT)
        gw = H.start_gateway({ conf = CONF, upstream = up, vars = { SCRIPT = sdir .. "/shared.lua" } })
    end)

    teardown(function()
        if gw then gw:stop() end
        if up then up:stop() end
        H.rm_rf(sdir)
    end)

    it("counts exactly across two workers under concurrent requests", function()
        local conns, total = {}, 0
        for round = 1, 10 do
            for i = 1, 20 do
                local c = assert(H.connect(gw.port))
                assert(c:send(H.build_request(gw.port, { method = "GET", path = "/count" })))
                conns[i] = c
            end
            for i = 1, 20 do
                local r = conns[i]:read_response({ timeout = 10 })
                assert.truthy(r and r.status == 200, ctx(gw, "round " .. round))
                conns[i]:close()
                total = total + 1
            end
        end
        local r = assert(H.request(gw.port, { method = "GET", path = "/count" }))
        assert.equal(tostring(total + 1), r.body, ctx(gw))
        assert.equal(0, #up:hits())
    end)

    it("keeps strings, numbers and booleans for every worker, and lets them expire", function()
        assert.equal("ok", assert(H.request(gw.port, { path = "/set?k=flag&v=on" })).body)
        for _ = 1, 6 do -- new connections: both workers answer some
            assert.equal("string:on", assert(H.request(gw.port, { path = "/get?k=flag" })).body)
        end
        assert.equal("nil:nil", assert(H.request(gw.port, { path = "/get?k=nothing" })).body)
        assert.equal("ok", assert(H.request(gw.port, { path = "/set?k=brief&v=x&ttl=0.2" })).body)
        local gone = H.wait_until(function()
            return assert(H.request(gw.port, { path = "/get?k=brief" })).body == "nil:nil"
        end, 5)
        assert.truthy(gone, "a value with a ttl of 0.2 s did not expire")
    end)

    it("evicts the least recently used when full, and refuses what it cannot keep", function()
        local r = assert(H.request(gw.port, { path = "/fill" }))
        assert.equal("nil|true", r.body, ctx(gw))
        r = assert(H.request(gw.port, { path = "/bad" }))
        assert.equal("falsefalsefalsefalsenilnot found", r.body, ctx(gw))
    end)

    it("keeps what it holds when a worker is replaced", function()
        assert(H.request(gw.port, { path = "/set?k=kept&v=yes" }))
        local before = gw:workers()
        assert.truthy(#before >= 1)
        os.execute("kill -9 " .. before[1])
        H.wait_until(function()
            local now = gw:workers()
            return #now == 2 and now[1] ~= before[1] and now[2] ~= before[1]
        end, 10)
        for _ = 1, 4 do
            assert.equal("string:yes", assert(H.request(gw.port, { path = "/get?k=kept" })).body, ctx(gw))
        end
    end)

    it("is refused by -t when undeclared, badly sized or declared twice", function()
        local conf = sdir .. "/bad.conf"
        for _, case in ipairs({ { "lua_shared_dict a 1k;", "from 8k to 1g" },
                                { "lua_shared_dict a 1m; lua_shared_dict a 2m;", "already declared" },
                                { "lua_shared_dict a-b 1m;", "invalid name" } }) do
            H.write_file(conf, "http { " .. case[1] .. " server { listen 127.0.0.1:1; } }\n")
            local code, out = H.run({ H.bin(), "-t", "-c", conf }, { timeout = 10 })
            assert.equal(1, code, out)
            assert.truthy(out:find(case[2], 1, true), out)
            assert.truthy(out:find(conf .. ":1:", 1, true), out)
        end
    end)
end)
