-- The idempotency store's record, end to end, against the real binary and a real LMDB file: a record whose
-- bytes changed (its body, its fields' length, its head) is never replayed nor run again, at run time (503,
-- the key's digest in the log) and for `ricochet -t`; a lock outlives a forward step of the wall clock
-- (Debian's faketime); a stored answer's Set-Cookie goes only to the client it was stored for.
package.path = "tests/e2e/?.lua;" .. package.path
local H = require("helpers")
local I = require("idem_helpers")

local ctx = H.context
local problem_type = I.problem_type

local LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"

-- idempotency_store_failure open: a damaged record is answered 503 even so.
local CONF = [[
worker_processes 2;
error_log logs/error.log info;
http {
    access_log logs/access.log;
    upstream up { server {{UPSTREAM}}; retry_budget off; }
    server {
        listen 127.0.0.1:{{PORT}};
        server_name gw;
        idempotency_store lmdb:{{STORE}} size=4m;
        idempotency_store_failure open;
        idempotency_lock_ttl 60s;
        location / { proxy_pass http://up; }
        location /shared/ { idempotency_scope off; proxy_pass http://up; }
    }
}
]]

-- Writes bytes at an offset of an existing file, in place (the workers' map sees it at once).
local function overwrite(path, offset, bytes)
    local f = assert(io.open(path, "r+b"))
    assert(f:seek("set", offset))
    assert(f:write(bytes))
    f:close()
end

local function hex(bytes)
    return (bytes:gsub(".", function(ch) return ("%02x"):format(ch:byte()) end))
end

local function be32(bytes, at) -- 0-based offset
    local a, b, c, d = bytes:byte(at + 1, at + 4)
    return ((a * 256 + b) * 256 + c) * 256 + d
end

-- Every copy in the file of the done record whose body starts with marker: its 0-based offset, its key
-- (the 32 bytes before it in its LMDB leaf node, whose head ends with the key's size) and its fields' length.
-- The record: 'd', expires (8), fingerprint (32), token (16), lapse (8), boot (16), client (16), checksum (16),
-- then the status (2), the fields' length (4), the fields and the body.
local function find_records(store, marker)
    local bytes = assert(H.read_file(store))
    local out, from = {}, 1
    for _ = 1, 100 do
        local at = bytes:find(marker, from, true)
        if not at then break end
        from = at + 1
        local body = at - 1
        for s = body - 119, math.max(40, body - 119 - 4096), -1 do
            if bytes:byte(s + 1) == 100 and bytes:byte(s + 114) * 256 + bytes:byte(s + 115) == 201
                and s + 119 + be32(bytes, s + 115) == body
                and bytes:byte(s - 33) + 256 * bytes:byte(s - 32) == 32 then
                out[#out + 1] = { off = s, key = bytes:sub(s - 31, s), flen = be32(bytes, s + 115),
                    bytes = bytes:sub(s + 1, body + #marker) }
                break
            end
        end
    end
    return out
end

describe("the idempotency store's record", function()
    local up, dir, store
    local gws = {}

    before_each(function()
        up = H.start_upstream()
        dir = H.mkdtemp("rec")
        store = dir .. "/s.mdb"
    end)

    after_each(function()
        for _, gw in ipairs(gws) do gw:stop() end
        gws = {}
        if up then up:stop() end
        H.rm_rf(dir)
    end)

    local function start(env)
        local gw = H.start_gateway({ conf = CONF, upstream = up, vars = { STORE = store }, env = env })
        gws[#gws + 1] = gw
        return gw
    end

    -- `ricochet -t` on the gateway's config, kept in dir (its prefix goes when it stops).
    local function test_conf()
        return H.run({ H.bin(), "-t", "-p", dir, "-c", dir .. "/ricochet.conf" }, { timeout = 60 })
    end

    it("that fails its checksum is never sent nor run again: 503 with its digest logged; -t names it",
        function()
        local gw = start()
        -- three answers, each with a body found nowhere else
        local cases = {
            { key = "kbody", what = "a byte of its body" },
            { key = "kflen", what = "its fields' length" },
            { key = "khead", what = "its expiry, zeroed: it looks expired" },
        }
        for i, case in ipairs(cases) do
            case.marker = ("MARKER%d-%s"):format(i, H.text_body(40, 900 + i):gsub("%W", "x"))
            up:program({ default = { status = 201, headers = { ["X-Marker"] = "m" .. i }, body = case.marker } })
            local r = assert(I.post(gw.port, "/d/" .. i, case.key, '{"i":' .. i .. "}"))
            assert.equal(201, r.status, ctx(gw))
            local again = assert(I.repeat_post(gw.port, "/d/" .. i, case.key, '{"i":' .. i .. "}"))
            assert.equal("true", again.headers["idempotent-replayed"], ctx(gw))
            assert.equal(case.marker, again.body)
        end
        assert.equal(3, #up:hits())
        -- the byte changed in every copy of each record
        for _, case in ipairs(cases) do
            case.copies = find_records(store, case.marker)
            assert.truthy(#case.copies >= 1, "the record of " .. case.key .. " is nowhere in " .. store)
            for _, c in ipairs(case.copies) do
                if case.key == "kbody" then
                    overwrite(store, c.off + 119 + c.flen + 2, "#")
                elseif case.key == "kflen" then
                    overwrite(store, c.off + 118, string.char((c.flen + 1) % 256))
                else
                    overwrite(store, c.off + 1, ("\0"):rep(8))
                end
            end
        end
        for i, case in ipairs(cases) do
            for n = 1, 3 do -- on either worker
                local r = assert(I.post(gw.port, "/d/" .. i, case.key, '{"i":' .. i .. "}"))
                assert.equal(503, r.status, ctx(gw, case.what .. ": " .. r.body))
                assert.equal("application/problem+json", r.headers["content-type"])
                assert.equal("urn:ricochet:problem:idempotency-store-unavailable", problem_type(r), r.body)
                assert.is_nil(r.body:find("MARKER", 1, true), r.body)
                assert.is_nil(r.headers["x-marker"], case.what .. " " .. n)
                assert.is_nil(r.headers["idempotent-replayed"])
            end
            local digest = hex(case.copies[1].key)
            assert.truthy(gw:log():find("the record of key digest " .. digest .. " fails its checksum", 1, true),
                ctx(gw, case.what))
        end
        assert.equal(3, #up:hits()) -- the upstream was not called again
        H.write_file(dir .. "/ricochet.conf", assert(H.read_file(gw.conf_path)))
        gw:stop()
        -- -t: each change alone makes the file damaged, naming the record's digest
        for _, case in ipairs(cases) do
            for _, c in ipairs(case.copies) do overwrite(store, c.off, c.bytes) end
        end
        local code, out = test_conf()
        assert.equal(0, code, out)
        for _, case in ipairs(cases) do
            for _, c in ipairs(case.copies) do
                if case.key == "kbody" then
                    overwrite(store, c.off + 119 + c.flen + 2, "#")
                elseif case.key == "kflen" then
                    overwrite(store, c.off + 118, string.char((c.flen + 1) % 256))
                else
                    overwrite(store, c.off + 1, ("\0"):rep(8))
                end
            end
            code, out = test_conf()
            assert.equal(1, code, case.what .. ": " .. out)
            assert.truthy(out:find("is damaged", 1, true), out)
            assert.truthy(out:find("key digest " .. hex(case.copies[1].key) .. ", a value of %d+ bytes%) fails its "
                .. "checksum"), case.what .. ": " .. out)
            for _, c in ipairs(case.copies) do overwrite(store, c.off, c.bytes) end
        end
    end)

    it("keeps a lock through a forward step of the wall clock: the repeat gets 409, then the replay", function()
        local clock = dir .. "/faketime"
        H.write_file(clock, "+0\n")
        local release = dir .. "/release"
        up:program({ sequence = {
            { status = 201, body = "charged once", hold_file = release },
            { status = 201, body = "charged twice" },
        } })
        -- the wall clock is faked (from a file read at every call); the monotonic and boot clocks stay real. An
        -- ASan build accepts the preloaded library ahead of its runtime.
        local asan = os.getenv("ASAN_OPTIONS")
        local gw = start({ LD_PRELOAD = LIBFAKETIME, FAKETIME_TIMESTAMP_FILE = clock, FAKETIME_NO_CACHE = "1",
            FAKETIME_DONT_FAKE_MONOTONIC = "1",
            ASAN_OPTIONS = (asan and asan ~= "" and asan .. ":" or "") .. "verify_asan_link_order=0" })
        local c = assert(H.connect(gw.port))
        assert(c:send(("POST /pay HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nIdempotency-Key: kclock\r\n"
            .. "Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"):format(gw.port)))
        assert.truthy(H.wait_until(function() return #up:hits() == 1 end, 20), ctx(gw))
        -- the wall clock steps 90 s forward: past the lock's idempotency_lock_ttl (60 s) on that clock
        H.write_file(clock, "+90\n")
        local r = assert(I.post(gw.port, "/pay", "kclock", "{}"))
        assert.equal(409, r.status, ctx(gw, r.body))
        assert.equal("urn:ricochet:problem:idempotency-key-in-use", problem_type(r), r.body)
        H.write_file(release, "go")
        local first = assert(c:read_response({ timeout = 30 }))
        c:close()
        assert.equal(201, first.status)
        assert.equal("charged once", first.body)
        local again = assert(I.repeat_post(gw.port, "/pay", "kclock", "{}"))
        assert.equal(201, again.status, ctx(gw, again.body))
        assert.equal("charged once", again.body)
        assert.equal("true", again.headers["idempotent-replayed"])
        assert.equal(1, #up:hits())
    end)

    it("replays a stored Set-Cookie only to the client it was stored for", function()
        up:program({ default = { status = 201, body = "session made",
            headers = { { "Set-Cookie", "session=A; HttpOnly" }, { "X-Kept", "yes" } } } })
        local gw = start()
        local a = { { "Cookie", "a=1" } }
        local b = { { "Cookie", "b=2" } }
        local first = assert(I.post(gw.port, "/shared/x", "kcookie", "{}", a))
        assert.equal(201, first.status, ctx(gw))
        assert.equal("session=A; HttpOnly", first.headers["set-cookie"])
        -- another client, same key (idempotency_scope off: one key space): the answer, without the cookie
        local other = assert(I.repeat_post(gw.port, "/shared/x", "kcookie", "{}", b))
        assert.equal(201, other.status, ctx(gw, other.body))
        assert.equal("true", other.headers["idempotent-replayed"])
        assert.equal("session made", other.body)
        assert.equal("yes", other.headers["x-kept"])
        assert.is_nil(other.headers["set-cookie"], ctx(gw))
        -- no Cookie at all: another client too
        local bare = assert(I.repeat_post(gw.port, "/shared/x", "kcookie", "{}"))
        assert.equal("true", bare.headers["idempotent-replayed"])
        assert.is_nil(bare.headers["set-cookie"])
        -- the client it was stored for: with it
        local same = assert(I.repeat_post(gw.port, "/shared/x", "kcookie", "{}", a))
        assert.equal("true", same.headers["idempotent-replayed"])
        assert.equal("session=A; HttpOnly", same.headers["set-cookie"])
        assert.equal("yes", same.headers["x-kept"])
        assert.equal(1, #up:hits())
    end)
end)
