-- The smaller findings of issue 33 (item 7) against the real binary, one worker: the gateway's deadline and
-- attempt fields replace a script's; req:respond's field names are case-insensitive; one ttl rule for the
-- shared dictionary, the kit's (tests/lua/kit_spec.lua runs the same scripts); a lua_shared_dict declared
-- after the script line that names it; a ctx kept from an earlier on_log refuses :set.
package.path = "tests/e2e/?.lua;tests/lua/?.lua;" .. package.path
local H = require("helpers")
local F = require("fixes_scripts")

local FIELDS = [[
return { on_request = function(req)
    req:set_header("X-Request-Timeout", "999999")
    req:set_header("X-Ricochet-Attempt", "77")
    if req.path == "/f/type" then
        req:respond(200, { ["Content-Type"] = "text/html", ["content-type"] = "text/plain" }, "mine")
    end
end }
]]

-- the dictionary the ttl script's main chunk names is declared after the script line, at the block's end
local CONF = [[
worker_processes 1;
error_log logs/error.log info;
http {
    access_log logs/access.log;
    upstream up { server {{UPSTREAM}}; retry_budget off; }
    server {
        listen 127.0.0.1:{{PORT}};
        location /f/ { script {{FIELDS}}; proxy_pass http://up; }
        location /c/ { proxy_set_header X-Ricochet-Attempt 5; proxy_set_header X-Request-Timeout 9;
                       proxy_pass http://up; }
        location /t { script {{TTL}}; proxy_pass http://up; }
        location /keep { script {{KEPT}}; proxy_pass http://up; }
        location /other { script {{KEPT}}; proxy_pass http://up; }
    }
    lua_shared_dict ttl 1m;
}
]]

local ctx = H.context

describe("the script API's smaller findings", function()
    local up, gw, dir

    setup(function()
        up = H.start_upstream()
        dir = H.mkdtemp("fixes")
        H.write_file(dir .. "/fields.lua", FIELDS)
        H.write_file(dir .. "/ttl.lua", F.TTL_SCRIPT)
        H.write_file(dir .. "/kept.lua", F.KEPT_SCRIPT)
        gw = H.start_gateway({ conf = CONF, upstream = up, vars = { FIELDS = dir .. "/fields.lua",
            TTL = dir .. "/ttl.lua", KEPT = dir .. "/kept.lua" } })
    end)

    teardown(function()
        if gw then gw:stop() end
        if up then up:stop() end
        H.rm_rf(dir)
    end)

    before_each(function() up:reset() end)

    it("sends one X-Request-Timeout and one X-Ricochet-Attempt upstream, the gateway's", function()
        for _, path in ipairs({ "/f/x", "/c/x" }) do
            up:reset()
            local r = assert(H.request(gw.port, { path = path }))
            assert.equal(200, r.status, ctx(gw))
            local hit = up:hits()[1]
            assert.same({ "1" }, H.hit_values(hit, "X-Ricochet-Attempt"), path)
            local deadline = H.hit_values(hit, "X-Request-Timeout")
            assert.equal(1, #deadline, path)
            -- what is left of the default retry_timeout (30 s), in ms: not the script's nor the config's
            local ms = tonumber(deadline[1])
            assert.truthy(ms and ms > 9 and ms <= 30000, path .. ": " .. tostring(deadline[1]))
        end
    end)

    it("refuses req:respond given one field name in two spellings", function()
        up:program({ default = { status = 200, body = "ok\n", headers = { ["Content-Type"] = "text/plain" } } })
        local r = assert(H.request(gw.port, { path = "/f/type" }))
        -- the script's answer is refused: the request fell back to the upstream's, with one Content-Type
        assert.equal(200, r.status)
        assert.equal("ok\n", r.body)
        assert.equal(1, #H.header_values(r, "Content-Type"), ctx(gw))
        assert.truthy(gw:log():find("fields.lua:5: req:respond: ", 1, true), ctx(gw))
        assert.truthy(gw:log():find("are one field (names are case-insensitive): give it once", 1, true))
    end)

    it("takes a shared ttl as the kit does, under 1 ms as 1 ms, from a dictionary declared after", function()
        for case, want in pairs(F.TTL_WANT) do
            local r = assert(H.request(gw.port, { path = "/t?set=" .. case }))
            assert.equal(200, r.status, ctx(gw))
            assert.equal(want, r.headers["x-set"], case .. "\n" .. ctx(gw))
        end
        H.sleep(0.05) -- far past 1 ms
        local function get(key) return assert(H.request(gw.port, { path = "/t?get=" .. key })).headers["x-get"] end
        assert.equal("nil", get("tiny"))
        assert.equal("v", get("zero"))
        assert.equal("v", get("none"))
        assert.equal("nil", get("neg"))
    end)

    it("refuses ctx:set on a ctx kept from an earlier on_log: the other line lacks its field", function()
        assert.equal(200, assert(H.request(gw.port, { path = "/keep" })).status)
        assert.equal(200, assert(H.request(gw.port, { path = "/other" })).status)
        local other = H.wait_until(function()
            local e = H.access_entries(gw, "/other")
            return e[#e] and e[#e].script
        end, 5)
        assert.truthy(other, ctx(gw))
        assert.is_nil(other.leak, ctx(gw))
        assert.is_true(other.kept_refused)
        assert.equal("ctx:set: this ctx is an earlier request's (kept from its on_log): only the ctx on_log is "
            .. "given may be set", other.kept_error)
        local keep = H.access_entries(gw, "/keep")
        assert.same({ mine = "a" }, keep[#keep].script)
    end)
end)

describe("a lua_shared_dict named in a main chunk", function()
    it("may be declared anywhere in the http block; a name never declared is refused with its script's line",
        function()
        local dir = H.mkdtemp("dictorder")
        H.write_file(dir .. "/typo.lua", 'local d = ricochet.shared("tll")\nreturn {}\n')
        local conf = dir .. "/r.conf"
        H.write_file(conf, ([[
http {
    server { listen 127.0.0.1:1; location / { script %s/typo.lua; proxy_pass http://127.0.0.1:2; } }
    lua_shared_dict ttl 1m;
}
]]):format(dir))
        local code, out = H.run({ H.bin(), "-p", dir, "-t", "-c", conf })
        H.rm_rf(dir)
        assert.is_not.equal(0, code, out)
        assert.truthy(out:find("typo.lua:1: ricochet.shared: no lua_shared_dict \"tll\"", 1, true), out)
    end)
end)
