-- The idempotency store's rules end to end: the kill switch keeps dedupe, which upstream statuses release a key
-- (and idempotency_store_status), how the key field is read, and idempotency_scope in the record key. The real
-- binary (2 workers) in front of the fault upstream, with a real LMDB file. Every spec checks what the clients got
-- and how often the upstream executed.
package.path = "tests/e2e/?.lua;" .. package.path
local H = require("helpers")

local ctx = H.context

local I = require("idem_helpers")
local post, repeat_post = I.post, I.repeat_post
local function new_key() return I.new_key("rule") end

-- A POST written byte for byte, so a field can be sent empty ("Idempotency-Key:") or twice; field_lines are the
-- lines after Host. Returns the one parsed response (or nil and why).
local function raw_post(port, path, field_lines, body)
    body = body or '{"amount":10}'
    local bytes = ("POST %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"):format(path, port)
        .. table.concat(field_lines, "\r\n") .. "\r\n"
        .. "Content-Type: application/json\r\nContent-Length: " .. #body .. "\r\nConnection: close\r\n\r\n" .. body
    local data, _, err = H.raw(port, bytes, { timeout = 5 })
    local list, perr = H.parse_responses(data or "")
    if #list ~= 1 then
        return nil, ("%d responses (%s, %s) in %q"):format(#list, tostring(err), tostring(perr), tostring(data))
    end
    return list[1]
end

local problem_type = I.problem_type

local function assert_key_invalid(gw, r, what)
    assert.truthy(r, ctx(gw, what))
    assert.equal(400, r.status, ctx(gw, what .. ": " .. tostring(r.body)))
    assert.equal("application/problem+json", r.headers["content-type"], what)
    assert.equal("urn:ricochet:problem:idempotency-key-invalid", problem_type(r), what .. ": " .. r.body)
end

local CONF = [[
worker_processes 2;
error_log logs/error.log info;
http {
    access_log logs/access.log;
    upstream up { server {{UPSTREAM}}; retry_budget off; }
    server {
        listen 127.0.0.1:{{PORT}};
        retry_backoff 1ms 2ms;
        idempotency_store lmdb:{{STORE}};
        location / { proxy_pass http://up; }
        location /off/ { retries off; idempotency_store lmdb:{{STORE_OFF}}; proxy_pass http://up; }
        location /once/ { retry_attempts 1; proxy_pass http://up; }
        location /release404/ { retry_attempts 1; idempotency_store_status 404; proxy_pass http://up; }
        location /shared/ { idempotency_scope off; proxy_pass http://up; }
        location /apikey/ { idempotency_scope X-Api-Key; proxy_pass http://up; }
    }
}
]]

-- Three identical keyed POSTs: the first executes, the other two get its stored 200.
local function assert_deduped(gw, up, path)
    up:program({ default = { status = 200, body = '{"charged":1}' } })
    local key = new_key()
    local first = assert(post(gw.port, path, key))
    assert.equal(200, first.status, ctx(gw))
    assert.equal('{"charged":1}', first.body)
    assert.is_nil(first.headers["idempotent-replayed"])
    for i = 2, 3 do
        local again = assert(repeat_post(gw.port, path, key))
        assert.equal(200, again.status, ctx(gw, "POST " .. i))
        assert.equal('{"charged":1}', again.body)
        assert.equal("true", again.headers["idempotent-replayed"], ctx(gw, "POST " .. i .. " was not replayed"))
    end
    assert.equal(1, #up:hits(), ctx(gw))
end

-- The upstream answers status for a keyed POST; a repeat with the same key must reach it again.
local function assert_released(gw, up, path, status, reason)
    up:reset()
    up:program({ default = { status = status, reason = reason, body = "status " .. status } })
    local key = new_key()
    local first = assert(post(gw.port, path, key))
    assert.equal(status, first.status, ctx(gw, "first answer to a " .. status))
    assert.equal(1, #up:hits(), ctx(gw, status))
    local again = assert(repeat_post(gw.port, path, key))
    assert.equal(status, again.status, ctx(gw, "repeat after a " .. status))
    assert.equal("status " .. status, again.body)
    assert.is_nil(again.headers["idempotent-replayed"], ctx(gw, "a " .. status .. " was replayed"))
    assert.equal(2, #up:hits(), ctx(gw, "the repeat after a " .. status .. " did not reach the upstream"))
end

-- The upstream answers status for a keyed POST; a repeat with the same key gets it replayed.
local function assert_stored(gw, up, path, status)
    up:reset()
    up:program({ default = { status = status, body = "status " .. status } })
    local key = new_key()
    assert.equal(status, assert(post(gw.port, path, key)).status, ctx(gw))
    local again = assert(repeat_post(gw.port, path, key))
    assert.equal(status, again.status, ctx(gw, "repeat after a " .. status))
    assert.equal("status " .. status, again.body)
    assert.equal("true", again.headers["idempotent-replayed"], ctx(gw, "a " .. status .. " was not stored"))
    assert.equal(1, #up:hits(), ctx(gw, status))
end

describe("the idempotency store's rules", function()
    local up, gw, dir

    setup(function()
        up = H.start_upstream()
        dir = H.mkdtemp("idemrules")
        gw = H.start_gateway({ conf = CONF, upstream = up,
            vars = { STORE = dir .. "/idem.mdb", STORE_OFF = dir .. "/off.mdb" } })
    end)

    teardown(function()
        if gw then gw:stop() end
        if up then up:stop() end
        if dir then os.execute("rm -rf " .. H.shell_quote(dir)) end
    end)

    before_each(function() up:reset() end)

    it("dedupes keyed POSTs where retries are off", function()
        assert_deduped(gw, up, "/off/pay")
    end)

    it("releases the key after a 503 where retries are off", function()
        up:program({ sequence = { 503 }, default = { status = 201, body = "done" } })
        local key = new_key()
        assert.equal(503, assert(post(gw.port, "/off/pay", key)).status, ctx(gw))
        assert.equal(1, #up:hits(), ctx(gw))
        local again = assert(repeat_post(gw.port, "/off/pay", key))
        assert.equal(201, again.status, ctx(gw))
        assert.equal("done", again.body)
        assert.is_nil(again.headers["idempotent-replayed"])
        assert.equal(2, #up:hits())
    end)

    it("releases the key after a 408, 409, 425 or 429", function()
        assert_released(gw, up, "/once/pay", 408)
        assert_released(gw, up, "/once/pay", 409)
        assert_released(gw, up, "/once/pay", 425, "Too Early")
        assert_released(gw, up, "/once/pay", 429)
    end)

    it("keeps a 400 and a 404", function()
        assert_stored(gw, up, "/once/pay", 400)
        assert_stored(gw, up, "/once/pay", 404)
    end)

    it("releases a 404 where idempotency_store_status lists it, and still keeps a 400 and releases a 409", function()
        assert_released(gw, up, "/release404/pay", 404)
        assert_stored(gw, up, "/release404/pay", 400)
        assert_released(gw, up, "/release404/pay", 409)
    end)

    it("answers 400 idempotency-key-invalid for an empty key, quoted or not, and never asks the upstream", function()
        assert_key_invalid(gw, raw_post(gw.port, "/pay", { "Idempotency-Key:" }), "Idempotency-Key: (empty)")
        assert_key_invalid(gw, raw_post(gw.port, "/pay", { "Idempotency-Key: " }), "Idempotency-Key: (a space)")
        assert_key_invalid(gw, assert(post(gw.port, "/pay", '""')), 'Idempotency-Key: ""')
        assert.equal(0, #up:hits(), ctx(gw))
    end)

    it("answers 400 idempotency-key-invalid for two key fields, even one empty or both the same", function()
        assert_key_invalid(gw, raw_post(gw.port, "/pay", { "Idempotency-Key:", "Idempotency-Key: abc" }),
            "an empty field, then abc")
        assert_key_invalid(gw, raw_post(gw.port, "/pay", { "Idempotency-Key: abc", "Idempotency-Key:" }),
            "abc, then an empty field")
        local same = new_key()
        assert_key_invalid(gw, assert(H.request(gw.port, { method = "POST", path = "/pay", body = "{}",
            headers = { { "Idempotency-Key", same }, { "Idempotency-Key", same } } })), "the same key twice")
        assert.equal(0, #up:hits(), ctx(gw))
    end)

    it("takes a key of 255 bytes, refuses one of 256", function()
        local long = new_key() .. "-"
        assert_key_invalid(gw, assert(post(gw.port, "/pay", long .. ("x"):rep(256 - #long))), "a 256-byte key")
        assert.equal(0, #up:hits(), ctx(gw))
        local k255 = long .. ("y"):rep(255 - #long)
        assert.equal(255, #k255)
        local r = assert(post(gw.port, "/pay", k255))
        assert.equal(200, r.status, ctx(gw, r.body))
        assert.is_nil(r.headers["idempotent-replayed"])
        assert.equal(1, #up:hits())
        local again = assert(repeat_post(gw.port, "/pay", k255))
        assert.equal("true", again.headers["idempotent-replayed"], ctx(gw))
        assert.equal(1, #up:hits())
    end)

    it("takes the quoted form \"abc\" as the same key as abc", function()
        up:program({ default = { status = 201, body = "quoted" } })
        local key = new_key()
        local first = assert(post(gw.port, "/pay", '"' .. key .. '"'))
        assert.equal(201, first.status, ctx(gw))
        local bare = assert(repeat_post(gw.port, "/pay", key))
        assert.equal(201, bare.status, ctx(gw))
        assert.equal("quoted", bare.body)
        assert.equal("true", bare.headers["idempotent-replayed"], ctx(gw, "abc was not the key \"abc\""))
        assert.equal(1, #up:hits())
    end)

    it("keeps each Authorization's answers apart by default", function()
        up:program({ default = { status = 200, echo = true } }) -- the answer shows the request it answered
        local key = new_key()
        local a = assert(post(gw.port, "/pay", key, nil, { { "Authorization", "Bearer A" } }))
        assert.equal(200, a.status, ctx(gw))
        assert.truthy(a.body:find("Bearer A", 1, true), a.body)
        assert.equal(1, #up:hits())
        local b = assert(repeat_post(gw.port, "/pay", key, nil, { { "Authorization", "Bearer B" } }))
        assert.equal(200, b.status, ctx(gw))
        assert.is_nil(b.headers["idempotent-replayed"], ctx(gw, "Bearer B got Bearer A's answer: " .. b.body))
        assert.truthy(b.body:find("Bearer B", 1, true), b.body)
        assert.equal(2, #up:hits())
        local a2 = assert(repeat_post(gw.port, "/pay", key, nil, { { "Authorization", "Bearer A" } }))
        assert.equal(200, a2.status, ctx(gw))
        assert.equal("true", a2.headers["idempotent-replayed"], ctx(gw))
        assert.equal(a.body, a2.body)
        assert.equal(2, #up:hits())
    end)

    it("shares one key space among all clients with idempotency_scope off", function()
        up:program({ default = { status = 200, echo = true } })
        local key = new_key()
        local a = assert(post(gw.port, "/shared/pay", key, nil, { { "Authorization", "Bearer A" } }))
        assert.equal(200, a.status, ctx(gw))
        local b = assert(repeat_post(gw.port, "/shared/pay", key, nil, { { "Authorization", "Bearer B" } }))
        assert.equal(200, b.status, ctx(gw))
        assert.equal("true", b.headers["idempotent-replayed"], ctx(gw))
        assert.equal(a.body, b.body)
        assert.truthy(b.body:find("Bearer A", 1, true), b.body)
        assert.equal(1, #up:hits())
    end)

    it("scopes keys by the field idempotency_scope names, and by it alone", function()
        up:program({ default = { status = 200, echo = true } })
        local key = new_key()
        local one = assert(post(gw.port, "/apikey/pay", key, nil,
            { { "X-Api-Key", "k1" }, { "Authorization", "Bearer A" } }))
        assert.equal(200, one.status, ctx(gw))
        assert.equal(1, #up:hits())
        local other = assert(repeat_post(gw.port, "/apikey/pay", key, nil,
            { { "X-Api-Key", "k2" }, { "Authorization", "Bearer A" } }))
        assert.equal(200, other.status, ctx(gw))
        assert.is_nil(other.headers["idempotent-replayed"], ctx(gw, "X-Api-Key k2 got k1's answer"))
        assert.truthy(other.body:find("k2", 1, true), other.body)
        assert.equal(2, #up:hits())
        local same = assert(repeat_post(gw.port, "/apikey/pay", key, nil,
            { { "X-Api-Key", "k1" }, { "Authorization", "Bearer B" } }))
        assert.equal(200, same.status, ctx(gw))
        assert.equal("true", same.headers["idempotent-replayed"], ctx(gw, "another Authorization made another key"))
        assert.equal(one.body, same.body)
        assert.equal(2, #up:hits())
    end)
end)

describe("the idempotency store under RICOCHET_NO_RETRY=1", function()
    local up, gw, dir

    setup(function()
        up = H.start_upstream()
        dir = H.mkdtemp("idemkill")
        gw = H.start_gateway({ conf = CONF, upstream = up, env = { RICOCHET_NO_RETRY = "1" },
            vars = { STORE = dir .. "/idem.mdb", STORE_OFF = dir .. "/off.mdb" } })
    end)

    teardown(function()
        if gw then gw:stop() end
        if up then up:stop() end
        if dir then os.execute("rm -rf " .. H.shell_quote(dir)) end
    end)

    before_each(function() up:reset() end)

    it("retries nothing, and still dedupes keyed POSTs", function()
        -- the switch is on: a GET's 503, retried 5 times in all elsewhere, is tried once
        up:program({ default = { status = 503, body = "down" } })
        local get = assert(H.request(gw.port, { path = "/list" }))
        assert.equal(503, get.status, ctx(gw))
        assert.equal(1, #up:hits(), ctx(gw, "RICOCHET_NO_RETRY=1 did not stop the retries"))
        assert.truthy(gw:log():find("RICOCHET_NO_RETRY=1: every retry is off", 1, true), ctx(gw))
        up:reset()
        assert_deduped(gw, up, "/pay")
    end)

    it("releases the key after a 503", function()
        up:program({ sequence = { 503 }, default = { status = 201, body = "done" } })
        local key = new_key()
        assert.equal(503, assert(post(gw.port, "/pay", key)).status, ctx(gw))
        assert.equal(1, #up:hits(), ctx(gw))
        local again = assert(repeat_post(gw.port, "/pay", key))
        assert.equal(201, again.status, ctx(gw))
        assert.equal("done", again.body)
        assert.equal(2, #up:hits())
    end)
end)

describe("idempotency_scope and idempotency_store_status in the config", function()
    local dir

    before_each(function() dir = H.mkdtemp("idemrconf") end)
    after_each(function() os.execute("rm -rf " .. H.shell_quote(dir)) end)

    it("are shown by ricochet plan", function()
        H.write_file(dir .. "/plan.conf", ([[
http {
    upstream up { server 127.0.0.1:1; }
    server {
        listen 127.0.0.1:1;
        idempotency_store lmdb:%s/i.mdb;
        location /pay { proxy_pass http://up; }
        location /shared { idempotency_scope off; proxy_pass http://up; }
        location /keyed { idempotency_scope X-Api-Key; idempotency_store_status 404; proxy_pass http://up; }
    }
}
]]):format(dir))
        local code, out = H.run({ H.bin(), "plan", "-c", dir .. "/plan.conf" })
        assert.equal(0, code, out)
        local pay = out:match("location /pay .-\n\n")
        local pay_scope = pay and pay:match("idempotency scope:[^\n]*")
        assert.truthy(pay_scope and pay_scope:find("Authorization", 1, true), out)
        local shared = out:match("location /shared .-\n\n")
        local shared_scope = shared and shared:match("idempotency scope:[^\n]*")
        assert.truthy(shared_scope and shared_scope:find("^idempotency scope: off"), out)
        local keyed = out:match("location /keyed .-\n\n")
        local keyed_scope = keyed and keyed:match("idempotency scope:[^\n]*")
        assert.truthy(keyed_scope and keyed_scope:find("X-Api-Key", 1, true), out)
        assert.truthy(keyed:find("released%)?:[^\n]* 404 408 409 425 429 5xx"), out)
        assert.is_nil(pay:find("released%)?:[^\n]* 404"), out)
    end)

    local function check(line)
        local path = dir .. "/ricochet.conf"
        H.write_file(path, table.concat({
            "http {",
            "    server {",
            "        listen 127.0.0.1:1;",
            "        location / {",
            "            " .. line,
            "            proxy_pass http://127.0.0.1:2;",
            "        }",
            "    }",
            "}",
            "",
        }, "\n"))
        return H.run({ H.bin(), "-t", "-c", path }, { timeout = 10 })
    end

    local function assert_refused(line, value)
        local code, out = check(line)
        assert.equal(1, code, out)
        assert.truthy(out:find(dir .. "/ricochet.conf:5: ", 1, true), "no FILE:LINE: in: " .. out)
        assert.truthy(out:find('"' .. value .. '"', 1, true), out)
        assert.matches("test failed", out)
    end

    it("refuses idempotency_store_status teapot and connect_error, and idempotency_scope $foo", function()
        assert_refused("idempotency_store_status teapot;", "teapot")
        assert_refused("idempotency_store_status connect_error;", "connect_error")
        assert_refused("idempotency_store_status 404 connect_error;", "connect_error")
        assert_refused("idempotency_scope $foo;", "$foo")
        local code, out = check("idempotency_store_status 404 4xx;")
        assert.equal(0, code, out)
        code, out = check("idempotency_scope $remote_addr;")
        assert.equal(0, code, out)
    end)
end)

-- Finding 8: the docs claimed "at most once across restarts"; a SIGKILL of the gateway breaks that. One section says
-- where the promise ends, and the README's headline points at it instead of claiming more.
describe("the docs on at most once", function()
    local function slurp(rel)
        local f = assert(io.open(H.root .. "/" .. rel, "rb"))
        local text = f:read("*a")
        f:close()
        return text
    end

    it("say where it ends in one place, and nowhere claim it across every restart", function()
        local readme, ref = slurp("README.md"), slurp("conf/REFERENCE.md")
        local start = ref:find('**Where "at most once" ends.**', 1, true)
        assert.truthy(start, "REFERENCE.md has no 'Where at most once ends' section")
        local section = ref:sub(start, (ref:find("\n\n[^-]", start + 40) or #ref))
        for _, limit in ipairs({ "killed", "SIGKILL", "persistence", "idempotency_store_failure open",
                                 "idempotency_store_recover", "idempotency_lock_ttl" }) do
            assert.truthy(section:find(limit, 1, true), "the section does not name: " .. limit .. "\n" .. section)
        end
        assert.is_nil(readme:find("across gateway restarts", 1, true), "README still claims every restart")
        assert.truthy(readme:find("Where at most once ends", 1, true), "README does not point at the section")
        assert.is_nil(ref:find("can\nnever let a request run twice", 1, true))
    end)
end)
