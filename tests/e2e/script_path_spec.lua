-- What a route script sees is what is routed (issue 33, item 3): locations match, and req.path shows, the
-- normalized path (as nginx's $uri), whatever the spelling of the target (absolute-form, "./", "//", %61,
-- "x/..", "%2e%2e"); req.query, req.host and req.target are as documented; the upstream still gets the
-- target as sent (in origin form). The real binary, one worker, counting the upstream's hits.
package.path = "tests/e2e/?.lua;" .. package.path
local H = require("helpers")

-- location /f/admin/: refuses everything, and says what it saw
local ADMIN = [[
local cjson = require("cjson")
return { on_request = function(req)
    req:respond(403, { ["Content-Type"] = "application/json" }, cjson.encode({ path = req.path,
        query = req.query, host = req.host, target = req.target }))
end }
]]

-- location /g/: a path check written the ordinary way, and what the script saw sent upstream
local CHECK = [[
return {
    on_request = function(req)
        if req.path:sub(1, 9) == "/g/admin/" then return req:respond(403, {}, "no admin") end
        req:set_header("X-Seen-Path", req.path)
        req:set_header("X-Seen-Query", req.query)
        req:set_header("X-Seen-Host", req.host)
        req:set_header("X-Seen-Target", req.target)
    end,
    on_log = function(ctx)
        ctx:set("path", ctx.path)
        ctx:set("target", ctx.target)
    end,
}
]]

local CONF = [[
worker_processes 1;
error_log logs/error.log info;
http {
    access_log logs/access.log;
    upstream up { server {{UPSTREAM}}; retry_budget off; }
    server {
        listen 127.0.0.1:{{PORT}};
        location /f/ { proxy_pass http://up; }
        location /f/admin/ { script {{ADMIN}}; proxy_pass http://up; }
        location /g/ { script {{CHECK}}; proxy_pass http://up; }
    }
}
]]

local ctx = H.context

-- every spelling of /P/admin/users a client could send
local function spellings(p)
    return {
        "http://anything/" .. p .. "/admin/users",
        "HTTP://Anything:8080/" .. p .. "/admin/users",
        "/" .. p .. "/./admin/users",
        "/" .. p .. "//admin/users",
        "//" .. p .. "///admin//users",
        "/" .. p .. "/%61dmin/users",
        "/" .. p .. "/%61%64%6D%69%6e/users",
        "/" .. p .. "/x/../admin/users",
        "/" .. p .. "/x/y/../../admin/users",
        "/" .. p .. "/%2e%2e/" .. p .. "/admin/users",
        "/" .. p .. "/x/%2E%2E/admin/./users",
        "/" .. p .. "/admin/users/.",
        "/" .. p .. "/admin/x/..",
        "http://anything/" .. p .. "/x/../admin/users",
    }
end

local function raw_get(gw, target, host)
    local out = H.raw(gw.port, "GET " .. target .. " HTTP/1.1\r\nHost: " .. (host or "a.test")
        .. "\r\nConnection: close\r\n\r\n")
    local resp = H.parse_responses(out or "")[1]
    assert.truthy(resp, ctx(gw, target .. ": no response, got " .. tostring(out)))
    return resp
end

describe("what the script sees is what is routed", function()
    local up, gw, dir

    setup(function()
        up = H.start_upstream()
        up:program({ default = { status = 200, body = "upstream" } })
        dir = H.mkdtemp("path")
        H.write_file(dir .. "/admin.lua", ADMIN)
        H.write_file(dir .. "/check.lua", CHECK)
        gw = H.start_gateway({ conf = CONF, upstream = up,
            vars = { ADMIN = dir .. "/admin.lua", CHECK = dir .. "/check.lua" } })
    end)

    teardown(function()
        if gw then gw:stop() end
        if up then up:stop() end
        H.rm_rf(dir)
    end)

    it("matches every spelling of /f/admin/ to its location, whose script sees the normalized path", function()
        local before = up:stats().hits
        for _, target in ipairs(spellings("f")) do
            local resp = raw_get(gw, target)
            assert.equal(403, resp.status, ctx(gw, target))
            local seen = H.json.decode(resp.body)
            local want = target:match("/x/%.%.$") and "/f/admin/" or target:match("/%.$") and "/f/admin/users/"
                or "/f/admin/users"
            assert.equal(want, seen.path, target)
            assert.equal(target, seen.target, target)
            assert.equal("", seen.query, target)
            assert.equal(target:find("nything") and "anything" or "a.test", seen.host, target)
        end
        assert.equal(before, up:stats().hits, "the upstream was reached")
    end)

    it("makes a script's own path check see every spelling of /g/admin/", function()
        local before = up:stats().hits
        for _, target in ipairs(spellings("g")) do
            local resp = raw_get(gw, target)
            assert.equal(403, resp.status, ctx(gw, target))
            assert.equal("no admin", resp.body, target)
        end
        assert.equal(before, up:stats().hits, "the upstream was reached")
    end)

    it("shows path, query, host and target as documented; the upstream gets the target in origin form", function()
        local cases = {
            { target = "http://Anything:8080/g/x/./y?q=1&r=%2F", host = "a.test",
              path = "/g/x/y", query = "q=1&r=%2F", shown_host = "anything", upstream = "/g/x/./y?q=1&r=%2F" },
            { target = "/g//a/%7euser/b%3f?", host = "Example.COM:8080",
              path = "/g/a/~user/b%3F", query = "", shown_host = "example.com", upstream = "/g//a/%7euser/b%3f?" },
            { target = "https://[::1]:8443/g/?x=/../", host = "a.test",
              path = "/g/", query = "x=/../", shown_host = "[::1]", upstream = "/g/?x=/../" },
            { target = "/g/p?a=/./..//", host = "a.test.",
              path = "/g/p", query = "a=/./..//", shown_host = "a.test", upstream = "/g/p?a=/./..//" },
        }
        for _, c in ipairs(cases) do
            local n = up:stats().hits
            local resp = raw_get(gw, c.target, c.host)
            assert.equal(200, resp.status, ctx(gw, c.target))
            local hit = up:wait_hits(n + 1)[n + 1]
            assert.equal(c.upstream, hit.target)
            assert.same({ c.path }, H.hit_values(hit, "X-Seen-Path"))
            assert.same({ c.query }, H.hit_values(hit, "X-Seen-Query"))
            assert.same({ c.shown_host }, H.hit_values(hit, "X-Seen-Host"))
            assert.same({ c.target }, H.hit_values(hit, "X-Seen-Target"))
        end
    end)

    it("gives on_log ctx.path (normalized) and ctx.target; the access log's path is the target as sent", function()
        local target = "/g/./log/%6Fne?k=v"
        assert.equal(200, raw_get(gw, target).status)
        local entry = H.wait_until(function()
            local entries = H.access_entries(gw, target)
            return entries[#entries] and entries[#entries].script and entries[#entries]
        end, 5)
        assert.truthy(entry, ctx(gw, "no access log line with path " .. target))
        assert.same({ path = "/g/log/one", target = target }, entry.script)
    end)

    it("answers 400, upstream untouched, to a path above the root, an encoded '/', NUL, backslash or '#'", function()
        local before = up:stats().hits
        for _, target in ipairs({ "/../x", "/g/../../x", "/g/%2e%2e/%2E%2E/x", "http://anything/../g/x",
                                  "/g/admin%2Fusers", "/g%2fadmin/users", "/g/a%00", "/g/%zz", "/g\\admin/users",
                                  "/g/admin\\users", "/g/admin#", "/g/admin/users#x", "/g/x?a=#",
                                  "http://anything#/g/admin/users" }) do
            local resp = raw_get(gw, target)
            assert.equal(400, resp.status, ctx(gw, target))
        end
        assert.equal(before, up:stats().hits, "the upstream was reached")
        -- and the worker goes on: an ordinary request is answered
        assert.equal(200, raw_get(gw, "/g/ok").status)
    end)
end)
