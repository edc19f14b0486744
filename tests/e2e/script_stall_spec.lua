-- Route scripts that stall their worker inside calls a count hook cannot interrupt (issue 33, item 6):
-- table.sort (in C without a comparator, or with a costly one), Lua patterns that backtrack for minutes on a
-- few hundred bytes, a plain find that compares length x length bytes, and loops whose every instruction
-- costs milliseconds (digests, comparisons and copies of long strings). Each must be stopped by
-- script_timeout and logged, the request answered by the built-in policy, and the same worker (same PID)
-- must answer the next request with the script's answer. The real binary, one worker, the fault upstream.
--
-- No assertion reads a clock. script_timeout is 100ms; script_memory_max (2g) and the instruction bound
-- (10,000,000) are far from anything these attacks reach: each would run for seconds to hours if nothing
-- stopped it, so only the time bound can end it within the request's 30 s.
package.path = "tests/e2e/?.lua;" .. package.path
local H = require("helpers")

local ctx = H.context

local HOSTILE = [[
local route = {}
local attacks = {}
-- a pattern that backtracks through C(300, 6) ways to split 300 bytes: minutes of LuaJIT's matcher
local subject, nested = ("a"):rep(300), ".-.-.-.-.-.-b"
attacks["/find-pattern"] = function() return subject:find(nested) end
attacks["/match-pattern"] = function() return subject:match("(" .. nested .. ")") end
attacks["/gmatch-pattern"] = function() for m in subject:gmatch(nested) do return m end end
attacks["/gsub-pattern"] = function() return (subject:gsub(nested, "x")) end
attacks["/pcall-pattern"] = function()
    -- a stop inside the matcher is not an error a script can catch
    for _ = 1, 1000000 do pcall(string.find, subject, nested) end
end
-- a plain find that compares 1 MB at each of 3 million places: LuaJIT's takes minutes in one call
attacks["/find-plain"] = function()
    local s, p = ("a"):rep(4000000), ("a"):rep(1000000) .. "b"
    for _ = 1, 100000 do s:find(p, 1, true) end
end
-- 20,000 times one 8 MB string: 300,000 comparisons of 8 MB each, in C unless the sandbox says otherwise
attacks["/sort-strings"] = function()
    local s, t = ("x"):rep(8000000), {}
    for i = 1, 20000 do t[i] = s end
    table.sort(t)
end
attacks["/sort-pattern-comparator"] = function()
    table.sort({ 3, 1, 2 }, function(a, b) return subject:find(nested) == nil and a < b end)
end
attacks["/sort-costly-comparator"] = function()
    local s, t = ("x"):rep(4000000), {}
    for i = 1, 2000 do t[i] = s end
    table.sort(t, function(a, b) return a .. "" < b .. "" end)
end
-- loops whose every instruction costs milliseconds
-- one strftime over a million conversions (glibc reads the time zone file for each %s)
attacks["/os-date"] = function() return os.date(("%s"):rep(1000000)) end
-- a header table far past respond's 100 fields, walked by the compiled library, which no hook stops
attacks["/respond-fields"] = function(req)
    local h = {}
    for i = 1, 2000 do h["x-" .. i] = "v" end
    req:respond(200, h, "x")
end
attacks["/sha256"] = function()
    local s, h = ("x"):rep(8000000), ricochet.sha256
    for _ = 1, 100000 do h(s) end
end
attacks["/hmac"] = function()
    local s, h = ("x"):rep(8000000), ricochet.hmac_sha256
    for _ = 1, 100000 do h(s, s) end
end
attacks["/compare"] = function()
    local r = ("x"):rep(4000000)
    local a, b, n = r .. "a", r .. "b", 0
    for _ = 1, 1000000 do if a < b then n = n + 1 end end
    return n
end
attacks["/concat"] = function()
    local r = ("x"):rep(4000000)
    for i = 1, 1000000 do local _ = r .. i end
end
attacks["/table-concat"] = function()
    local r = ("x"):rep(4000000)
    local t = { r, r, r, r }
    for _ = 1, 1000000 do table.concat(t) end
end
attacks["/unpack-char"] = function()
    local codes = {}
    for i = 1, 7000 do codes[i] = 65 + i % 26 end
    for _ = 1, 1000000 do string.char(unpack(codes)) end
end
-- the digests, now sliced, give what they gave: keys and messages around the block and slice sizes
local function digests()
    local out = {}
    for _, kn in ipairs({ 0, 3, 64, 65, 300000 }) do
        for _, mn in ipairs({ 0, 5, 600000 }) do
            out[#out + 1] = ricochet.hmac_sha256(("k"):rep(kn), ("m"):rep(mn))
        end
    end
    out[#out + 1] = ricochet.sha256(("m"):rep(600000))
    return table.concat(out, " ")
end
function route.on_request(req)
    if req.path == "/digests" then req:set_header("X-Digests", digests()) end
    local attack = attacks[req.path]
    if attack then attack(req) end
    req:set_header("X-Script-Ran", "yes")
end
return route
]]

-- what a script sees of sort and patterns, with error messages stripped of their place: the gateway and the
-- test kit must agree
local SUMMARY = [[
local function try(f, ...)
    local r = { pcall(f, ...) }
    if not r[1] then return "error: " .. tostring(r[2]):gsub("^[^:]*:%d+: ", "") end
    for i = 2, #r do r[i] = tostring(r[i]) end
    return table.concat(r, ",", 2)
end
return { on_request = function(req)
    local out = {}
    local t = { "pear", "apple", "fig", "apple" }
    table.sort(t)
    out[#out + 1] = table.concat(t, ",")
    local n = { 3, 1.5, -2, 10 }
    table.sort(n)
    out[#out + 1] = table.concat(n, ",")
    out[#out + 1] = try(table.sort, { 1, "x" })
    out[#out + 1] = try(table.sort, { 2, 1 }, false)
    out[#out + 1] = try(string.find, "key = value; k2 = v2", "(%w+)%s*=%s*(%w+)", 5)
    out[#out + 1] = try(string.match, "  trim me  ", "^%s*(.-)%s*$")
    out[#out + 1] = try(string.gsub, "a,b,,c", ",", ";", 2)
    out[#out + 1] = try(string.gsub, "hello world", "(%w+)", "<%1>")
    out[#out + 1] = try(string.find, "abc", "[a")
    out[#out + 1] = try(string.gsub, "abc", "(", "x")
    local words = {}
    for w in ("one two three"):gmatch("%a+") do words[#words + 1] = w end
    out[#out + 1] = table.concat(words, "+")
    req:set_header("X-Summary", table.concat(out, " | "))
end }
]]

local CONF = [[
worker_processes 1;
error_log logs/error.log info;
http {
    script_timeout 100ms;
    script_memory_max 2g;
    upstream up { server {{UPSTREAM}}; retry_budget off; }
    server {
        listen 127.0.0.1:{{PORT}};
        location / { script {{SCRIPT}}; proxy_pass http://up; }
    }
}
]]

local STOPPED = "stopped: it ran longer than a hook may"

-- what the test kit computes for digests() above
local function kit_digests()
    package.path = "scripts/?.lua;" .. package.path
    local kit = require("ricochet.testing")
    local out = {}
    for _, kn in ipairs({ 0, 3, 64, 65, 300000 }) do
        for _, mn in ipairs({ 0, 5, 600000 }) do
            out[#out + 1] = kit.hmac_sha256(("k"):rep(kn), ("m"):rep(mn))
        end
    end
    out[#out + 1] = kit.sha256(("m"):rep(600000))
    return table.concat(out, " ")
end

describe("a route script stalled in a call the count hook cannot interrupt", function()
    local sdir = H.mkdtemp("stall")
    local up, gw, worker

    setup(function()
        up = H.start_upstream()
        H.write_file(sdir .. "/hostile.lua", HOSTILE)
        gw = H.start_gateway({ conf = CONF, upstream = up, vars = { SCRIPT = sdir .. "/hostile.lua" } })
        local r = assert(H.request(gw.port, { method = "GET", path = "/warm" }))
        assert(r.status == 200, ctx(gw))
        worker = gw:workers()[1]
    end)

    teardown(function()
        if gw then gw:stop() end
        if up then up:stop() end
        H.rm_rf(sdir)
    end)

    it("sorts and matches as the test kit does", function()
        H.write_file(sdir .. "/summary.lua", SUMMARY)
        package.path = "scripts/?.lua;" .. package.path
        local kit = require("ricochet.testing")
        local route = assert(kit.load(sdir .. "/summary.lua"))
        local req = kit.request{ method = "GET", path = "/" }
        route.on_request(req)
        local want = kit.upstream(req)["x-summary"]
        assert.truthy(want:find("apple,apple,fig,pear", 1, true), want)
        local gw2 = H.start_gateway({ conf = CONF, upstream = up, vars = { SCRIPT = sdir .. "/summary.lua" } })
        local ok, err = pcall(function()
            up:reset()
            local r = assert(H.request(gw2.port, { method = "GET", path = "/" }))
            assert.equal(200, r.status)
            assert.same({ want }, H.hit_values(up:hits()[1], "X-Summary"), ctx(gw2))
        end)
        gw2:stop()
        assert(ok, err)
    end)

    it("gives the digests the test kit gives, for long keys and messages too", function()
        up:reset()
        local r = assert(H.request(gw.port, { method = "GET", path = "/digests", timeout = 30 }))
        assert.equal(200, r.status)
        assert.same({ kit_digests() }, H.hit_values(up:hits()[1], "X-Digests"), ctx(gw))
    end)

    it("refuses an os.date format over 256 bytes and a respond over 100 fields before doing the work", function()
        for path, why in pairs({ ["/os-date"] = "os.date: a format is at most 256 bytes",
                                 ["/respond-fields"] = "req:respond: at most 100 fields" }) do
            up:reset()
            local r = assert(H.request(gw.port, { method = "GET", path = path, timeout = 30 }))
            assert.equal(200, r.status, ctx(gw, path))
            assert.same({}, H.hit_values(up:hits()[1], "X-Script-Ran"), ctx(gw, path))
            assert.truthy(gw:log():find(why, 1, true), ctx(gw, path))
            assert.same({ worker }, gw:workers(), ctx(gw, path .. ": the worker changed"))
        end
    end)

    for _, path in ipairs({
        "/find-pattern", "/match-pattern", "/gmatch-pattern", "/gsub-pattern", "/pcall-pattern", "/find-plain",
        "/sort-strings", "/sort-pattern-comparator", "/sort-costly-comparator", "/sha256", "/hmac", "/compare",
        "/concat", "/table-concat", "/unpack-char",
    }) do
        it("is stopped by script_timeout in " .. path .. ", and the same worker serves on", function()
            local _, before = gw:log():gsub(STOPPED, "")
            up:reset()
            local r = H.request(gw.port, { method = "GET", path = path, timeout = 30 })
            assert.truthy(r, "no answer to " .. path .. "\n" .. ctx(gw))
            -- the built-in policy answered: the request went upstream without the script's header
            assert.equal(200, r.status, ctx(gw, path))
            local hits = up:hits()
            assert.equal(1, #hits, ctx(gw, path))
            assert.same({}, H.hit_values(hits[1], "X-Script-Ran"), ctx(gw, path))
            local _, after = gw:log():gsub(STOPPED, "")
            assert.equal(before + 1, after, ctx(gw, path .. ": one stop logged"))
            -- the same worker answers the next request, and the script runs again
            assert.same({ worker }, gw:workers(), ctx(gw, path .. ": the worker changed"))
            up:reset()
            local again = assert(H.request(gw.port, { method = "GET", path = "/fine", timeout = 30 }))
            assert.equal(200, again.status)
            assert.same({ "yes" }, H.hit_values(up:hits()[1], "X-Script-Ran"), ctx(gw, path))
        end)
    end
end)
