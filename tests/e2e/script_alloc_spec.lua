-- What a route script makes the gateway copy outside its Lua state (issue 33, item 5): header values of
-- req:set_header and res:set_header, req:respond's fields and body, on_log's ctx:set. Each is bounded (a
-- field over a client's field section is a script error, a request's edits copy at most 64 KiB, setting a
-- name again reuses its room), so no script grows a worker: the real binary, one worker, its peak and
-- resident memory read from /proc before and after, and the same worker answering afterwards.
package.path = "tests/e2e/?.lua;" .. package.path
local H = require("helpers")

-- The big strings are made once, when the script loads: the requests themselves allocate nothing of them
-- in Lua, so whatever the worker's memory does is the gateway's copying.
local SCRIPT = [[
local big = ("x"):rep(4 * 1024 * 1024)
local mib = ("m"):rep(1024 * 1024)
local kib = ("k"):rep(1024)
local s256 = ("s"):rep(256)
local on = {}
on["/a/headers"] = function(req)
    for i = 1, 8 do req:set_header("X-Big-" .. i, big) end
end
on["/a/respond-field"] = function(req) req:respond(200, { ["X-Big"] = big }, "no") end
on["/a/respond-fields"] = function(req)
    local h = {}
    for i = 1, 40 do h["X-F" .. i] = kib end -- 40 KiB in all, each small
    req:respond(200, h, "no")
end
on["/a/respond-loop"] = function(req)
    for i = 1, 200 do req:respond(200, { ["X-N"] = i }, mib) end
end
on["/a/edit-loop"] = function(req)
    for i = 1, 100000 do req:set_header("X-Loop", kib) end
    req:set_header("X-Loop", "last")
end
on["/a/allowed"] = function(req) -- within every bound: 60 KiB of fields
    req:set_header("X-A", ("a"):rep(30 * 1024))
    req:set_header("X-B", ("b"):rep(30 * 1024))
end
on["/a/edit-names"] = function(req)
    for i = 1, 100 do req:set_header("X-N" .. i, kib) end -- 100 KiB: over what a request's edits copy
end
local route = {}
function route.on_request(req)
    local f = on[req.path]
    if f then f(req) end
    req:set_header("X-Script-Ran", "yes")
end
function route.on_response(res)
    if res:header("X-Res-Big") then res:set_header("X-Res", big) end
end
function route.on_log(ctx)
    if ctx.path == "/a/ctx-loop" then
        for i = 1, 400000 do ctx:set("k", s256) end
        ctx:set("n", 1)
    end
end
return route
]]

-- script_timeout far from anything the loops take, so only the memory side decides
local CONF = [[
worker_processes 1;
error_log logs/error.log info;
http {
    access_log logs/access.log;
    script_timeout 20s;
    upstream up { server {{UPSTREAM}}; retry_budget off; }
    server {
        listen 127.0.0.1:{{PORT}};
        location /a/ { script {{SCRIPT}}; proxy_pass http://up; }
    }
}
]]

local ctx = H.context

local function status_kb(pid, field)
    local text = H.read_file("/proc/" .. pid .. "/status") or ""
    return tonumber(text:match(field .. ":%s*(%d+)"))
end

-- The worker's peak starts again from where it is now (Linux: clear_refs 5).
local function reset_peak(pid)
    local f = io.open("/proc/" .. pid .. "/clear_refs", "w")
    if f then f:write("5"); f:close() end
end

local sanitized = H.sanitized

describe("what a script makes the gateway copy", function()
    local up, gw, dir, worker

    setup(function()
        up = H.start_upstream()
        dir = H.mkdtemp("alloc")
        H.write_file(dir .. "/alloc.lua", SCRIPT)
        gw = H.start_gateway({ conf = CONF, upstream = up, vars = { SCRIPT = dir .. "/alloc.lua" } })
        local r = assert(H.request(gw.port, { path = "/a/warm" }))
        assert(r.status == 200, ctx(gw))
        worker = gw:workers()[1]
    end)

    teardown(function()
        if gw then gw:stop() end
        if up then up:stop() end
        H.rm_rf(dir)
    end)

    before_each(function() up:reset(); up:program({ default = { status = 200, body = "ok\n" } }) end)

    -- Runs fn with the worker's peak reset; the peak it reached over what it held before, in KiB.
    local function growth(fn)
        reset_peak(worker)
        local before = assert(status_kb(worker, "VmRSS"))
        fn()
        return assert(status_kb(worker, "VmHWM")) - before, before
    end

    -- The same worker answers an ordinary request, with the script's header.
    local function still_serving()
        assert.same({ worker }, gw:workers(), ctx(gw, "the worker changed"))
        up:reset()
        local r = assert(H.request(gw.port, { path = "/a/fine" }))
        assert.equal(200, r.status, ctx(gw))
        assert.same({ "yes" }, H.hit_values(up:hits()[1], "X-Script-Ran"))
    end

    local function within(kb, what)
        if not sanitized() then -- AddressSanitizer's allocator keeps what is freed in quarantine
            assert.truthy(kb < 10 * 1024, ("%s: the worker grew by %d KiB"):format(what, kb))
        end
    end

    it("refuses 8 x 4 MB header values from 30 slow requests as script errors, and holds nothing", function()
        up:program({ default = { status = 200, body = "ok\n", delay_ms = 200 } })
        local reqs = {}
        for i = 1, 30 do reqs[i] = { path = "/a/headers" } end
        local rs
        local peak, before = growth(function() rs = H.fire(gw.port, reqs, 30) end)
        for i = 1, 30 do
            assert.truthy(rs[i], ctx(gw, "request " .. i .. " got no answer"))
            assert.equal(200, rs[i].status, ctx(gw))
        end
        -- each fell back: sent upstream without the script's fields
        local hits = up:hits()
        assert.equal(30, #hits, ctx(gw))
        for _, hit in ipairs(hits) do
            assert.same({}, H.hit_values(hit, "X-Big-1"))
            assert.same({}, H.hit_values(hit, "X-Script-Ran"))
        end
        assert.truthy(gw:log():find("alloc.lua:7: req:set_header: a field of 4194311 bytes (name and value) "
            .. "is over the 32768 a client's field section may hold", 1, true), ctx(gw))
        within(peak, "30 requests of 8 x 4 MB headers (peak)")
        within(assert(status_kb(worker, "VmRSS")) - before, "30 requests of 8 x 4 MB headers (after)")
        still_serving()
    end)

    it("refuses a res:set_header value over the bound, and the answer goes unchanged", function()
        up:program({ default = { status = 200, body = "ok\n", headers = { ["X-Res-Big"] = "1" } } })
        local r
        local peak = growth(function() r = assert(H.request(gw.port, { path = "/a/res" })) end)
        assert.equal(200, r.status)
        assert.is_nil(r.headers["x-res"])
        assert.truthy(gw:log():find("res:set_header: a field of", 1, true), ctx(gw))
        within(peak, "res:set_header of 4 MB")
        still_serving()
    end)

    it("refuses req:respond with a field, or fields together, over a client's field section", function()
        for _, path in ipairs({ "/a/respond-field", "/a/respond-fields" }) do
            local r = assert(H.request(gw.port, { path = path }))
            -- not the script's answer: the request fell back to the upstream
            assert.equal(200, r.status, ctx(gw, path))
            assert.equal("ok\n", r.body, path)
            assert.is_nil(r.headers["x-big"])
        end
        assert.truthy(gw:log():find("req:respond: the fields are over the 32768 bytes", 1, true), ctx(gw))
        local _, n = gw:log():gsub("req:respond: the fields are over", "")
        assert.equal(2, n, ctx(gw))
        still_serving()
    end)

    it("holds one answer however often req:respond is called", function()
        local r
        local peak = growth(function() r = assert(H.request(gw.port, { path = "/a/respond-loop" })) end)
        assert.equal(200, r.status, ctx(gw))
        assert.equal("200", r.headers["x-n"]) -- the last call's answer
        assert.equal(1024 * 1024, #r.body)
        within(peak, "200 answers of 1 MiB")
        still_serving()
    end)

    it("copies a name set again into its room, and bounds what a request's edits copy", function()
        local r
        local peak = growth(function() r = assert(H.request(gw.port, { path = "/a/edit-loop" })) end)
        assert.equal(200, r.status, ctx(gw))
        assert.same({ "last" }, H.hit_values(up:hits()[1], "X-Loop"))
        within(peak, "100,000 set_header of one name")

        up:reset()
        r = assert(H.request(gw.port, { path = "/a/edit-names" }))
        assert.equal(200, r.status)
        assert.same({}, H.hit_values(up:hits()[1], "X-N1"), "a failed on_request changes nothing")
        assert.truthy(gw:log():find("req:set_header: the request's set_header calls would copy more than "
            .. "the 65536 bytes they may", 1, true), ctx(gw))
        still_serving()
    end)

    it("gives back what a burst of large but allowed fields held, once the worker is idle", function()
        up:program({ default = { status = 200, body = "ok\n", delay_ms = 200 } })
        local before = assert(status_kb(worker, "VmRSS"))
        local reqs = {}
        for i = 1, 200 do reqs[i] = { path = "/a/allowed" } end
        local rs = H.fire(gw.port, reqs, 200)
        for i = 1, 200 do assert.equal(200, rs[i] and rs[i].status, ctx(gw)) end
        assert.equal(("a"):rep(30 * 1024), H.hit_values(up:hits()[1], "X-A")[1])
        if not sanitized() then
            -- handed back after the last request ends (its connection's linger included): far within 10 s
            local back = H.wait_until(function()
                return assert(status_kb(worker, "VmRSS")) - before < 10 * 1024
            end, 10)
            assert.truthy(back, ("worker RSS %d KiB before, %d KiB after"):format(before,
                status_kb(worker, "VmRSS")))
        end
        still_serving()
    end)

    it("does not grow the pool with a loop of ctx:set", function()
        local peak = growth(function()
            local r = assert(H.request(gw.port, { path = "/a/ctx-loop" }))
            assert.equal(200, r.status)
            H.wait_until(function()
                local e = H.access_entries(gw, "/a/ctx-loop")
                return e[#e] and e[#e].script
            end, 10)
        end)
        local e = H.access_entries(gw, "/a/ctx-loop")
        assert.same({ k = ("s"):rep(256), n = 1 }, e[#e].script, ctx(gw))
        within(peak, "400,000 ctx:set")
        still_serving()
    end)
end)
