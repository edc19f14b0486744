-- The route script test kit (scripts/ricochet/testing.lua): the same api.lua and sandbox the gateway runs, over
-- a Lua binding. These specs pin the kit's objects to the gateway's documented behaviour.
package.path = "scripts/?.lua;tests/lua/?.lua;" .. package.path
local kit = require("ricochet.testing")

local dir = os.tmpname()
os.remove(dir)
assert(os.execute("mkdir -p '" .. dir .. "'"))
local function write(name, text)
    local f = assert(io.open(dir .. "/" .. name, "w"))
    f:write(text)
    f:close()
    return dir .. "/" .. name
end

-- scripts the gateway's specs run too (tests/e2e/script_api_fixes_spec.lua), expecting the same words
local F = require("fixes_scripts")
local TTL_SCRIPT, TTL_WANT, KEPT_SCRIPT = F.TTL_SCRIPT, F.TTL_WANT, F.KEPT_SCRIPT

describe("the test kit", function()
    teardown(function() os.execute("rm -rf '" .. dir .. "'") end)

    it("builds a req with the gateway's API", function()
        local req = kit.request{ method = "POST", path = "/pay", query = "a=1",
            headers = { ["Content-Type"] = "application/json", ["Idempotency-Key"] = "client" },
            body = '{"order_id":"A-17"}' }
        assert.equal("POST", req.method)
        assert.equal("/pay", req.path)
        assert.equal("a=1", req.query)
        assert.equal("application/json", req:header("content-type"))
        assert.equal("A-17", req:json().order_id)
        assert.equal("client", req:idempotency_key())
        req:set_idempotency_key("order-A-17")
        assert.equal("order-A-17", req:idempotency_key())
        req:set_header("X-Trace", "t1")
        req:set_header("Content-Type", nil)
        local up = kit.upstream(req)
        assert.equal("t1", up["x-trace"])
        assert.equal("order-A-17", up["idempotency-key"])
        assert.is_nil(up["content-type"])
        assert.is_nil(req:header("Content-Type"))
    end)

    it("refuses what the gateway refuses", function()
        local req = kit.request{}
        assert.has_error(function() req:set_header("Content-Length", "3") end,
            "req:set_header: Content-Length is the gateway's to set")
        assert.has_error(function() req:set_header("Bad Name", "x") end)
        assert.has_error(function() req:respond(99) end, "req:respond's status must be a number from 200 to 599")
        assert.has_error(function() req:set_idempotency_key("") end)
        assert.is_nil(kit.request{ body = "not json" }:json())
        assert.is_nil(kit.request{}:body())
    end)

    it("records req:respond", function()
        local req = kit.request{}
        req:respond(418, { ["X-Why"] = "because" }, "tea\n")
        assert.same({ status = 418, headers = { ["X-Why"] = "because" }, body = "tea\n" }, kit.answer(req))
    end)

    it("builds res and attempt", function()
        local res = kit.response{ status = 429, headers = { ["Retry-After"] = "3" }, body = '{"e":1}',
            classify_body_max = 4096 }
        assert.equal(429, res.status)
        assert.equal(3, res:retry_after())
        assert.equal("3", res:header("retry-after"))
        assert.equal(1, res:json().e)
        assert.is_nil(kit.response{ status = 200, body = '{"e":1}' }:body(), "no classify_body_max: no body")
        assert.is_nil(kit.response{ status = 200, body = '{"e":1}', classify_body_max = 3 }:body())
        local a = kit.attempt{ number = 2, class = "timeout" }
        assert.equal(2, a.number)
        assert.equal("timeout", a.class)
        assert.equal(30, a.remaining)
    end)

    it("computes SHA-256 and HMAC-SHA-256 as OpenSSL does", function()
        assert.equal("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", kit.sha256("abc"))
        assert.equal("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", kit.sha256(""))
        assert.equal("248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1",
            kit.sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"))
        -- RFC 4231 test case 2
        assert.equal("5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843",
            kit.hmac_sha256("Jefe", "what do ya want for nothing?"))
    end)

    it("loads a script with the gateway's sandbox and checks", function()
        local route = kit.load(write("ok.lua", [[
local route = {}
function route.on_request(req)
    if req.path == "/search" then req.idempotent = true end
    req:set_idempotency_key(ricochet.sha256(req:header("X-Order") or "none"):sub(1, 8))
    ricochet.log("info", "seen", req.path)
end
function route.classify(res) if res and res.status == 409 then return "accept" end end
return route
]]))
        local req = kit.request{ method = "POST", path = "/search", headers = { ["X-Order"] = "abc" } }
        route.on_request(req)
        assert.is_true(req.idempotent)
        assert.equal("ba7816bf", req:idempotency_key())
        assert.equal("seen /search", kit.logs[#kit.logs].message)
        assert.equal("accept", route.classify(kit.response{ status = 409 }, kit.attempt{}))
        assert.is_nil(route.classify(nil, kit.attempt{ class = "reset" }))
        assert.has_error(function() kit.load(write("io.lua", "io.open('/etc/passwd')\nreturn {}\n")) end)
        assert.has_error(function() kit.load(write("typo.lua", "return { on_requets = function() end }\n")) end)
        assert.has_error(function() kit.load(write("syntax.lua", "local x = = 1\n")) end)
    end)

    it("gives the same bounds and isolation as the gateway: locked objects, own cjson, a ctx per request", function()
        local route = kit.load(write("bounds.lua", [[
local route = {}
function route.on_request(req)
    req.ctx.tenant = req:header("X-Tenant")
    local ok = pcall(function() req.__index.json = function() return {} end end)
    req:set_header("X-Index", ok and "reached" or "refused")
    ok = pcall(function() rawset(req, "json", 1) end)
    req:set_header("X-Rawset", ok and "done" or "refused")
    require("cjson.safe").decode_max_depth(1)
    req:set_header("X-Nested", req:json() and req:json().a and "yes" or "no")
    local function f() return (("x"):gsub("x", f)) end
    ok = pcall(f)
    req:set_header("X-Gsub", ok and "ran" or "stopped")
    ok = pcall(string.rep, 1234567890, 107374183)
    req:set_header("X-Rep", ok and "ran" or "refused")
end
function route.classify(res, attempt)
    return attempt.ctx.tenant == "A" and "accept" or "fail"
end
return route
]]))
        local req = kit.request{ method = "POST", path = "/", headers = { ["X-Tenant"] = "A" },
            body = '{"a":{"b":1}}' }
        route.on_request(req)
        local up = kit.upstream(req)
        assert.equal("refused", up["x-index"])
        assert.equal("refused", up["x-rawset"])
        assert.equal("yes", up["x-nested"])
        assert.equal("stopped", up["x-gsub"])
        assert.equal("refused", up["x-rep"])
        assert.equal("accept", route.classify(kit.response{ status = 200 }, kit.attempt{ ctx = req.ctx }))
        assert.equal("fail", route.classify(kit.response{ status = 200 }, kit.attempt{}))
        assert.has_error(function() kit.attempt{}.number = 2 end)
    end)

    it("reuses one req, res and attempt from call to call, as the gateway does", function()
        local route = kit.load(write("keeper.lua", [[
local route = {}
local first
function route.on_request(req)
    first = first or req -- kept across requests: it stands for whichever request runs now
    req:set_header("X-First-Path", first.path)
end
return route
]]))
        local a = kit.request{ path = "/a" }
        route.on_request(a)
        assert.equal("/a", kit.upstream(a)["x-first-path"])
        local b = kit.request{ path = "/b" }
        assert.equal(a, b)
        assert.equal("/b", a.path) -- the req kept from before reads the new request
        route.on_request(b)
        assert.equal("/b", kit.upstream(b)["x-first-path"])
        assert.is_nil(b:header("X-Anything"))
        assert.equal(kit.response{ status = 500 }, kit.response{ status = 200 })
        assert.equal(kit.attempt{ number = 1 }, kit.attempt{ number = 2 })
        assert.equal(2, kit.attempt{ number = 2 }.number)
    end)

    it("reads Retry-After as the gateway does, in all three HTTP-date forms", function()
        local now = 784111777 -- Sun, 06 Nov 1994 08:49:37 GMT
        assert.equal(3000, kit.retry_after_ms("3", now))
        assert.equal(3000, kit.retry_after_ms(" \t3\t", now))
        assert.equal(10000, kit.retry_after_ms("Sun, 06 Nov 1994 08:49:47 GMT", now))
        assert.equal(10000, kit.retry_after_ms("Sunday, 06-Nov-94 08:49:47 GMT", now))
        assert.equal(10000, kit.retry_after_ms("Sun Nov  6 08:49:47 1994", now))
        assert.equal(0, kit.retry_after_ms("Sun, 06 Nov 1994 08:00:00 GMT", now))
        assert.equal(0, kit.retry_after_ms("Sun, 06 Nov 1994 23:59:60 GMT", now) and 0)
        for _, bad in ipairs({ "", "3s", "-1", "1.5", "Sun, 31 Nov 1994 08:49:37 GMT", "Sun, 06 Nov 1994 08:49:60 GMT",
                               "Sun, 06 Nov 1994 08:49:37 UTC", "sun, 06 Nov 1994 08:49:37 GMT", "99999999999999999999" }) do
            assert.is_nil(kit.retry_after_ms(bad, now), bad)
        end
    end)

    it("refuses in classify what the gateway refuses there: changing the request", function()
        local route = kit.load(write("phases.lua", [[
local route = {}
local kept
function route.on_request(req) kept = req req:set_header("X-Seen", "1") end
function route.classify(res) kept:set_header("X-Late", "1") end
return route
]]))
        local req = kit.request{}
        route.on_request(req)
        assert.equal("1", kit.upstream(req)["x-seen"])
        local ok, err = pcall(route.classify, kit.response{ status = 503 }, kit.attempt{})
        assert.is_false(ok)
        assert.matches("req:set_header can only be called in on_request", err)
    end)

    it("gives req:headers(), req:args() and req.client as the gateway does", function()
        local req = kit.request{ path = "/", query = "q=a%20b+c&flag&r=1&r=2", headers = { ["X-Tag"] = "one" },
            client = "10.0.0.7" }
        assert.equal("one", req:headers()["x-tag"])
        local a = req:args()
        assert.equal("a b c", a.q)
        assert.is_true(a.flag)
        assert.same({ "1", "2" }, a.r)
        assert.equal("10.0.0.7", req.client)
        assert.equal("127.0.0.1", kit.request{}.client)
    end)

    it("runs on_response: res:set_header there, and only there", function()
        local route = kit.load(write("onresp.lua", [[
local route = {}
function route.on_response(res)
    res:set_header("X-Served-By", "ricochet")
    res:set_header("Server", nil)
    if res.status == 500 then res:set_header("Content-Length", "1") end
end
function route.classify(res) if res then res:set_header("X-Late", "1") end end
return route
]]))
        local res = kit.response{ status = 200, headers = { Server = "upstream/1.0", ["X-Id"] = "7" } }
        route.on_response(res)
        assert.same({ ["x-served-by"] = "ricochet", ["x-id"] = "7" }, kit.downstream(res))
        assert.has_error(function() route.on_response(kit.response{ status = 500 }) end)
        local ok, err = pcall(route.classify, kit.response{ status = 200 }, kit.attempt{})
        assert.is_false(ok)
        assert.matches("res:set_header can only be called in on_response", err)
    end)

    it("says callbacks nested more than 50 deep, and runs on after it", function()
        local route = kit.load(write("deep.lua", [[
local function deep() return (("x"):gsub("x", deep)) end
return { on_request = function(req)
    if req.path == "/deep" then deep() end
    req:set_header("X-Ok", string.format("%s", "fine"))
end }
]]))
        local ok, err = pcall(route.on_request, kit.request{ path = "/deep" })
        assert.is_false(ok)
        assert.matches("deep.lua:1: string.gsub: callbacks nested more than 50 deep", err, 1, true)
        local req = kit.request{ path = "/" }
        route.on_request(req)
        assert.equal("fine", kit.upstream(req)["x-ok"])
    end)

    it("names an error object by its type, with the script's FILE:LINE, as the gateway logs it", function()
        local route = kit.load(write("objects.lua", [[
return { on_request = function(req)
    if req.path == "/table" then error({ code = 7 }) end
    if req.path == "/nil" then error(nil) end
    local _ = ("x"):gsub("x", function() error({}) end)
end }
]]))
        local cases = { { "/table", "objects.lua:2: (error object is a table value)" },
            { "/nil", "objects.lua:3: (error object is a nil value)" },
            { "/callback", "objects.lua:4: (error object is a table value)" } }
        for _, case in ipairs(cases) do
            local ok, err = pcall(route.on_request, kit.request{ path = case[1] })
            assert.is_false(ok)
            assert.equal("string", type(err), case[1])
            assert.matches(case[2], err, 1, true)
        end
        local ok, err = pcall(kit.load, write("mainobj.lua", "error({})\nreturn {}\n"))
        assert.is_false(ok)
        assert.equal(dir .. "/mainobj.lua:1: (error object is a table value)", err)
    end)

    it("records ricochet.log as the error log writes it: control bytes escaped, one line", function()
        local route = kit.load(write("forge.lua", [[
return { on_request = function(req) ricochet.log("error", "a\nfake [error] line\r\tend\1\\", req:header("X-Note")) end }
]]))
        route.on_request(kit.request{ headers = { ["X-Note"] = "ok" } })
        assert.equal("a\\nfake [error] line\\r\\tend\\x01\\x5c ok", kit.logs[#kit.logs].message)
        assert.equal("caf\xc3\xa9 \\x7f", kit.as_logged("caf\xc3\xa9 \127"))
    end)

    it("finds the sandbox as before after a hook stopped deep in callbacks or in a module's main chunk", function()
        -- the gateway's stop, played here with a debug hook: past a count of instructions an error, then one
        -- at every instruction of the script and the sandbox (not of the caller: the gateway's is C, here the
        -- kit and this spec), so no way out of the sandbox runs
        local sandbox = require("ricochet.sandbox")
        local kit_source = debug.getinfo(kit.load, "S").source
        local spec_source = debug.getinfo(1, "S").source
        local function again()
            local source = debug.getinfo(2, "S").source
            if source == kit_source or source == spec_source then
                debug.sethook()
                return
            end
            error(sandbox.STOPPED, 0)
        end
        local function stop_after(hooks)
            local n = 0
            debug.sethook(function()
                n = n + 1
                if n >= hooks then
                    debug.sethook(again, "", 1)
                    error(sandbox.STOPPED, 0)
                end
            end, "", 1000)
        end
        write("lazy.lua", "if lazy_attack then lazy_attack() end\nreturn { tag = 'lazy' }\n")
        local route = kit.load(write("stopped.lua", [[
local function spin() while true do end end
local nest = {}
function nest.gsub(n) return (("x"):gsub("x", function() if n == 0 then spin() end return nest.gsub(n - 1) end)) end
function nest.sort(n) table.sort({ 2, 1 }, function(a, b) if n == 0 then spin() end nest.sort(n - 1) return a < b end) end
function nest.tostring(n)
    return tostring(setmetatable({}, { __tostring = function() if n == 0 then spin() end return nest.tostring(n - 1) end }))
end
function nest.format(n)
    return string.format("%s", setmetatable({}, { __tostring = function()
        if n == 0 then spin() end
        return nest.format(n - 1)
    end }))
end
return { on_request = function(req)
    if req.path == "/require" then lazy_attack = spin require("lazy") end
    if nest[req.path:sub(2)] then nest[req.path:sub(2)](20) end
    lazy_attack = nil
    req:set_header("X-Ok", string.format("%s %s", require("lazy").tag, (("x"):gsub("x", function() return "y" end))))
end }
]]))
        jit.off()
        jit.flush() -- compiled traces never run a count hook
        local ok, err = pcall(function()
            for _, path in ipairs({ "/gsub", "/sort", "/tostring", "/format", "/require", "/require" }) do
                for _ = 1, 2 do
                    stop_after(50)
                    local stopped, why = pcall(route.on_request, kit.request{ path = path })
                    debug.sethook()
                    assert.is_false(stopped, path)
                    assert.equal(sandbox.STOPPED, why, path)
                end
            end
        end)
        debug.sethook()
        jit.on()
        assert(ok, err)
        local req = kit.request{ path = "/" }
        route.on_request(req)
        assert.equal("lazy y", kit.upstream(req)["x-ok"])
    end)

    it("offers ricochet.shared with the gateway's API, in this process", function()
        local route = kit.load(write("shared.lua", [[
local hits = ricochet.shared("hits")
local route = {}
function route.on_request(req)
    req:set_header("X-N", tostring(hits:incr("n", 1, 0)))
    hits:set("last", req.path, 60)
end
return route
]]))
        for _ = 1, 3 do route.on_request(kit.request{ path = "/a" }) end
        assert.equal(3, kit.shared.hits.n.value)
        assert.equal("/a", kit.shared.hits.last.value)
        local d = kit.load(write("shared2.lua", "return {}")) and nil
        assert.is_nil(d)
    end)

    it("normalizes paths as the gateway does: every case of tests/path_cases.txt", function()
        local n = 0
        for line in io.lines("tests/path_cases.txt") do
            local path, want = line:match("^([^#%s]%S*)%s+(%S+)$")
            if path then
                n = n + 1
                local got, why = kit.normalize_path(path)
                if want == "400" then
                    assert.is_nil(got, path)
                    assert.truthy(why, path)
                else
                    assert.equal(want, got, path)
                end
            end
        end
        assert.is_true(n > 40)
    end)

    it("shows path, query, host and target as the gateway does", function()
        local req = kit.request{ target = "HTTP://Anything:8080/g/x/./y?q=1&r=%2F", headers = { Host = "a.test" } }
        assert.equal("/g/x/y", req.path)
        assert.equal("q=1&r=%2F", req.query)
        assert.equal("anything", req.host)
        assert.equal("HTTP://Anything:8080/g/x/./y?q=1&r=%2F", req.target)
        req = kit.request{ target = "/g//a/%7euser/b%3f?", headers = { Host = "Example.COM:8080" } }
        assert.equal("/g/a/~user/b%3F", req.path)
        assert.equal("", req.query)
        assert.equal("example.com", req.host)
        req = kit.request{ target = "https://[::1]:8443?x=/../" }
        assert.equal("/", req.path)
        assert.equal("x=/../", req.query)
        assert.equal("[::1]", req.host)
        req = kit.request{ path = "/f/%61dmin/./users", query = "a=b", host = "A.test." }
        assert.equal("/f/admin/users", req.path)
        assert.equal("/f/%61dmin/./users?a=b", req.target)
        assert.equal("a.test", req.host)
        req = kit.request{}
        assert.equal("/", req.path)
        assert.equal("/", req.target)
        assert.equal("", req.host)
    end)

    it("lets a script's path check see every spelling of the path, as in the gateway", function()
        local route = kit.load(write("admin.lua", [[
return { on_request = function(req)
    if req.path:sub(1, 9) == "/g/admin/" then req:respond(403, {}, "no admin") end
end }
]]))
        for _, target in ipairs({ "http://anything/g/admin/users", "/g/./admin/users", "/g//admin/users",
                                  "/g/%61dmin/users", "/g/x/../admin/users", "/g/%2e%2e/g/admin/users" }) do
            local req = kit.request{ target = target }
            route.on_request(req)
            assert.equal(403, (kit.answer(req) or {}).status, target)
        end
        local req = kit.request{ target = "/g/public/users" }
        route.on_request(req)
        assert.is_nil(kit.answer(req))
    end)

    it("refuses, as the gateway answers 400, a path above the root or an encoded slash", function()
        for _, target in ipairs({ "/../x", "http://a/../x", "/f/admin%2Fusers", "/a\\b" }) do
            local ok, err = pcall(kit.request, { target = target })
            assert.is_false(ok, target)
            assert.matches("the gateway answers 400", err, 1, true)
        end
        assert.has_error(function() kit.request{ target = "/a", path = "/b" } end,
            "kit.request: give target, or path and query, not both")
    end)

    it("has the gateway's cjson: lua-cjson's texts and errors, and the settings and arrays it refuses", function()
        local route = kit.load(write("json.lua", [[
local cjson, safe = require("cjson"), require("cjson.safe")
local route = {}
function route.on_request(req)
    local body = req:json()
    local bad, err = safe.decode("{")
    req:set_header("X-Json", cjson.encode({ body.list, body.none == cjson.null, bad == nil, err }))
    local huge = req.path == "/huge"
    if req.path == "/sparse-off" or huge then
        cjson.encode_sparse_array(false, 0, 0)
        safe.encode_sparse_array(false, 0, 0)
        req:set_header("X-Holes", cjson.encode({ [3] = 1 }))
        local s, why = safe.encode({ [2 ^ 31 - 1] = 1 })
        req:set_header("X-Safe", tostring(s) .. " " .. why)
        if huge then cjson.encode({ [2 ^ 31 - 1] = 1 }) end
    elseif req.path == "/depth" then
        cjson.decode_max_depth(2 ^ 31 - 1)
    elseif req.path == "/sparse-cast" then
        cjson.encode_sparse_array(false, 2 ^ 40)
    end
end
return route
]]))
        local function run(path)
            local req = kit.request{ method = "POST", path = path, body = '{"list":[1,2.5,"a/b\\u00e9",true,{"k":[]},1e300],"none":null}' }
            local ok, err = pcall(route.on_request, req)
            return kit.upstream(req), ok, err
        end
        local up = run("/")
        assert.equal('[[1,2.5,"a\\/b\195\169",true,{"k":{}},1e+300],true,true,'
            .. '"Expected object key string but found T_END at character 2"]', up["x-json"])
        up = run("/sparse-off")
        assert.equal("[null,null,1]", up["x-holes"])
        assert.equal("nil Cannot serialise table: array index 2147483647 is over 16777216", up["x-safe"])
        local _, ok, err = run("/huge")
        assert.is_false(ok)
        assert.matches("Cannot serialise table: array index 2147483647 is over 16777216", err, 1, true)
        _, ok, err = run("/depth")
        assert.is_false(ok)
        assert.matches("bad argument #1 to 'decode_max_depth' (expected integer between 1 and 1000)", err, 1, true)
        _, ok, err = run("/sparse-cast")
        assert.is_false(ok)
        assert.matches("expected integer between 0 and 2147483647", err, 1, true)
    end)

    -- Issue 33: the kit refuses and keeps what the gateway refuses and keeps (tests/e2e/script_alloc_spec.lua
    -- and tests/e2e/script_api_fixes_spec.lua check the same cases against the binary).
    it("bounds what set_header and respond copy, as the gateway", function()
        local route = kit.load(write("alloc.lua", [[
local big, kib = ("x"):rep(40 * 1024), ("k"):rep(1024)
local on = {}
on["/big"] = function(req) req:set_header("X-Big", big) end
on["/loop"] = function(req) for _ = 1, 1000 do req:set_header("X-Loop", kib) end end
on["/names"] = function(req) for i = 1, 100 do req:set_header("X-N" .. i, kib) end end
on["/many"] = function(req) for i = 1, 101 do req:set_header("X-M" .. i, "1") end end
on["/respond-big"] = function(req) req:respond(200, { ["X-Big"] = big }, "") end
on["/respond-type"] = function(req)
    req:respond(200, { ["Content-Type"] = "text/html", ["content-type"] = "text/plain" }, "x")
end
return { on_request = function(req) on[req.path](req) end,
    on_response = function(res) res:set_header("X-Big", big) end }
]]))
        local function refused(path, want)
            local ok, err = pcall(route.on_request, kit.request{ path = path })
            assert.is_false(ok, path)
            assert.truthy(err:find(want, 1, true), err)
        end
        refused("/big", "alloc.lua:3: req:set_header: a field of 40965 bytes (name and value) is over the 32768 "
            .. "a client's field section may hold")
        refused("/names", "req:set_header: the request's set_header calls would copy more than the 65536 bytes")
        refused("/many", "req:set_header: a request's script sets or removes at most 100 fields")
        refused("/respond-big", "req:respond: the fields are over the 32768 bytes (names and values)")
        refused("/respond-type", "req:respond: ")
        refused("/respond-type", "are one field (names are case-insensitive): give it once")
        local req = kit.request{ path = "/loop" }
        route.on_request(req) -- a name set again copies into its room: 1,000 times is fine
        assert.equal(("k"):rep(1024), kit.upstream(req)["x-loop"])
        local ok, err = pcall(route.on_response, kit.response{})
        assert.is_false(ok)
        assert.truthy(err:find("res:set_header: a field of 40965 bytes", 1, true), err)
    end)

    it("sends the gateway's deadline and attempt fields, never a script's", function()
        local route = kit.load(write("fields.lua", [[
return { on_request = function(req)
    req:set_header("X-Request-Timeout", "999999")
    req:set_header("X-Ricochet-Attempt", "77")
    req:set_header("X-Mine", "1")
end }
]]))
        local req = kit.request{ headers = { ["X-Request-Timeout"] = "5" } }
        route.on_request(req)
        assert.same({ ["x-mine"] = "1" }, kit.upstream(req))
    end)

    it("takes a shared ttl of none or 0 to 1e9 seconds, whole milliseconds up, as the gateway", function()
        local route = kit.load(write("ttl.lua", TTL_SCRIPT))
        local function set(case)
            local req = kit.request{ path = "/t", query = "set=" .. case }
            route.on_request(req)
            return kit.answer(req).headers["X-Set"]
        end
        for case, want in pairs(TTL_WANT) do
            assert.equal(want, set(case), case)
        end
        assert.is_nil(kit.shared.ttl.none.expires)
        assert.is_nil(kit.shared.ttl.zero.expires)
        assert.truthy(kit.shared.ttl.tiny.expires, "a ttl under 1 ms expires (in 1 ms)")
        assert.is_nil(kit.shared.ttl.neg)
    end)

    it("refuses ctx:set on a ctx kept from an earlier on_log, as the gateway", function()
        local route = kit.load(write("kept.lua", KEPT_SCRIPT))
        local first = kit.log_ctx{ path = "/keep" }
        route.on_log(first)
        local second = kit.log_ctx{ path = "/other" }
        route.on_log(second)
        assert.same({ mine = "a" }, kit.log_fields(first))
        local got = kit.log_fields(second)
        assert.is_nil(got.leak)
        assert.is_true(got.kept_refused)
        assert.equal("ctx:set: this ctx is an earlier request's (kept from its on_log): only the ctx on_log is "
            .. "given may be set", got.kept_error)
        -- and its own ctx still takes a name set again, within the bounds
        for _ = 1, 1000 do second:set("k", ("s"):rep(256)) end
        assert.has_error(function() second:set("huge", ("s"):rep(257)) end,
            "ctx:set: a string value is at most 256 bytes")
    end)

    it("refuses what the gateway refuses before doing the work: a long os.date format, a respond over 100 fields", function()
        local route = kit.load(write("refusals.lua", [[
return { on_request = function(req)
    if req.path == "/date" then return os.date(("%s"):rep(300)) end
    if req.path == "/date-ok" then req:set_header("X-Year", os.date("!%Y", 0)) return end
    local h = {}
    for i = 1, 101 do h["x-" .. i] = "v" end
    req:respond(200, h, "x")
end }
]]))
        assert.has_error(function() route.on_request(kit.request{ path = "/date" }) end)
        local ok, err = pcall(route.on_request, kit.request{ path = "/date" })
        assert.is_false(ok)
        assert.matches("os.date: a format is at most 256 bytes", err, 1, true)
        local req = kit.request{ path = "/date-ok" }
        route.on_request(req)
        assert.equal("1970", kit.upstream(req)["x-year"])
        ok, err = pcall(route.on_request, kit.request{ path = "/fields" })
        assert.is_false(ok)
        assert.matches("req:respond: at most 100 fields", err, 1, true)
        assert.has_error(function() kit.request{ target = "/admin#" } end)
    end)
end)
