-- What goes back to the client is well-formed, byte for byte: a Content-Length an upstream repeated goes once,
-- the trailers of a chunked answer never reach the client (nor the Trailer field that announced them), whatever
-- pieces they come in, and the upstream connection is still reused after them.
package.path = "tests/e2e/?.lua;" .. package.path
local H = require("helpers")

local CONF = [[
worker_processes 1;
error_log logs/error.log info;
http {
    retry_budget off;
    upstream backend {
        server {{UPSTREAM}};
        keepalive 8;
    }
    server {
        listen 127.0.0.1:{{PORT}};
        location / {
            retries off;
            proxy_pass http://backend;
        }
        location /retry/ {
            retry_attempts 2;
            retry_backoff 10ms 10ms jitter=none adaptive=off;
            proxy_pass http://backend;
        }
    }
}
]]

-- The answer's head and everything after it, as the client got them.
local function split(raw)
    local at = raw:find("\r\n\r\n", 1, true)
    if not at then return raw, "" end
    return raw:sub(1, at + 3), raw:sub(at + 4)
end

-- The values of every field called name in a head, in order.
local function fields(head, name)
    local out = {}
    for n, v in head:gmatch("\r\n([^:\r\n]+):[ \t]*([^\r\n]*)") do
        if n:lower() == name:lower() then out[#out + 1] = v end
    end
    return out
end

local function get(port, path, extra)
    local raw = H.raw(port, "GET " .. path .. " HTTP/1.1\r\nHost: wire.test\r\n" .. (extra or "")
        .. "Connection: close\r\n\r\n", { timeout = 5 })
    return split(raw or "")
end

describe("what the client gets back", function()
    local up, gw

    setup(function()
        up = H.start_upstream()
        gw = H.start_gateway({ conf = CONF, upstream = up })
    end)

    teardown(function()
        if gw then gw:stop() end
        if up then up:stop() end
    end)

    before_each(function() up:reset() end)

    local function log() return "\ngateway log:\n" .. (gw and gw:log() or "?") end

    it("sends a Content-Length the upstream repeated (two fields, or a list) once", function()
        up:program({ routes = {
            ["/two"] = { default = { raw = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\n"
                .. "Content-Length: 5\r\n\r\nhello" } },
            ["/list"] = { default = { raw = "HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\nhello" } },
            ["/head"] = { default = { raw = "HTTP/1.1 200 OK\r\nContent-Length: 7\r\ncontent-length: 7\r\n\r\n" } },
        } })
        for _, path in ipairs({ "/two", "/list" }) do
            local head, rest = get(gw.port, path)
            assert.same({ "5" }, fields(head, "Content-Length"), path .. ":\n" .. head .. log())
            assert.equal("hello", rest, path)
        end
        local head_only = split(H.raw(gw.port, "HEAD /head HTTP/1.1\r\nHost: wire.test\r\nConnection: close\r\n\r\n",
            { timeout = 5 }) or "")
        assert.same({ "7" }, fields(head_only, "Content-Length"), head_only .. log())
        -- the one field sent is the only one left: the fields around it come as they came
        local head = get(gw.port, "/two")
        assert.same({ "1" }, fields(head, "X-A"))
    end)

    it("refuses two different Content-Length values with a 502 (a bad response)", function()
        up:program({ default = { raw = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!" } })
        local head, rest = get(gw.port, "/conflict")
        assert.truthy(head:find("^HTTP/1.1 502 "), head .. rest .. log())
        assert.falsy(rest:find("hello", 1, true))
        assert.truthy(gw:log():find("conflicting Content-Length", 1, true), log())
    end)

    local BODY = "5\r\nhello\r\n6\r\n world\r\n"
    local TRAILERS = "X-Checksum: abc\r\nContent-Length: 999\r\nTransfer-Encoding: gzip\r\nHost: evil.test\r\n"
        .. "Set-Cookie: s=1\r\n"
    local HEAD = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Checksum, Content-Length\r\n\r\n"

    it("relays a chunked answer without its trailers, and without the Trailer field that announced them", function()
        up:program({ default = { raw = HEAD .. BODY .. "0\r\n" .. TRAILERS .. "\r\n" } })
        local head, rest = get(gw.port, "/trailers")
        assert.truthy(head:find("^HTTP/1.1 200 "), head .. log())
        assert.same({}, fields(head, "Trailer"), head)
        assert.same({ "chunked" }, fields(head, "Transfer-Encoding"), head)
        assert.same({}, fields(head, "Content-Length"), head)
        assert.equal(BODY .. "0\r\n\r\n", rest)
    end)

    it("drops trailers that come in pieces (cut inside a field and inside the closing CRLF)", function()
        local pieces = { HEAD, BODY .. "0\r\nX-Check", "sum: abc\r\nContent-Len", "gth: 999\r\nHost: evil.test\r\n\r",
            "\n" }
        up:program({ default = { raw = pieces, body_delay_ms = 30, chunk_delay_ms = 30 } })
        local head, rest = get(gw.port, "/pieces")
        assert.truthy(head:find("^HTTP/1.1 200 "), head .. log())
        assert.equal(BODY .. "0\r\n\r\n", rest)
        -- a last chunk with an extension, and no trailers: as it came
        up:program({ default = { raw = { HEAD, BODY .. "0;last=1\r\n", "\r\n" }, body_delay_ms = 30,
            chunk_delay_ms = 30 } })
        head, rest = get(gw.port, "/extension")
        assert.equal(BODY .. "0;last=1\r\n\r\n", rest, head)
    end)

    it("drops a large trailer section after a body that fills the gateway's buffer", function()
        local data = H.text_body(31000)
        local body = ("%x\r\n"):format(#data) .. data .. "\r\n"
        local big = {}
        for i = 1, 100 do big[i] = ("X-Trailer-%03d: %s\r\n"):format(i, ("v"):rep(50)) end
        up:program({ default = { raw = HEAD .. body .. "0\r\n" .. table.concat(big) .. "\r\n" } })
        local head, rest = get(gw.port, "/big")
        assert.truthy(head:find("^HTTP/1.1 200 "), head .. log())
        assert.equal(#body + 5, #rest)
        assert.equal(body .. "0\r\n\r\n", rest)
    end)

    it("keeps the client's and the upstream's connections after an answer whose trailers it dropped", function()
        up:program({ routes = {
            ["/t"] = { default = { raw = { HEAD, BODY .. "0\r\nX-A: 1\r\n\r\n" } } },
            ["/next"] = { default = { body = "next" } },
        } })
        local conn = assert(H.connect(gw.port))
        assert(conn:send("GET /t HTTP/1.1\r\nHost: wire.test\r\n\r\n"))
        local r1, e1 = conn:read_response()
        assert.truthy(r1, tostring(e1) .. log())
        assert.equal("hello world", r1.body)
        assert.same({}, r1.trailers)
        local r2, e2 = conn:request({ path = "/next" })
        assert.truthy(r2, tostring(e2) .. log())
        assert.equal("next", r2.body)
        conn:close()
        local hits = up:hits()
        assert.equal(2, #hits)
        assert.equal(hits[1].conn, hits[2].conn)
    end)

    it("drops the trailers of an answer kept for a retry and given at the end", function()
        local raw = "HTTP/1.1 503 Busy\r\nTransfer-Encoding: chunked\r\nTrailer: X-A\r\n\r\n" .. BODY
            .. "0\r\nX-A: 1\r\nContent-Length: 5\r\n\r\n"
        up:program({ sequence = { { raw = raw }, { reset = "before_head" } } })
        local head, rest = get(gw.port, "/retry/kept")
        assert.truthy(head:find("^HTTP/1.1 503 "), head .. rest .. log())
        assert.equal(2, #up:hits())
        assert.same({}, fields(head, "Trailer"), head)
        assert.equal(BODY .. "0\r\n\r\n", rest)
    end)

    it("gives an HTTP/1.0 client the body decoded, without trailers, ended by the close", function()
        up:program({ default = { raw = HEAD .. BODY .. "0\r\n" .. TRAILERS .. "\r\n" } })
        local raw = H.raw(gw.port, "GET /old HTTP/1.0\r\nHost: wire.test\r\n\r\n", { timeout = 5 }) or ""
        local head, rest = split(raw)
        assert.truthy(head:find("^HTTP/1.1 200 "), raw .. log())
        assert.same({}, fields(head, "Transfer-Encoding"), head)
        assert.same({}, fields(head, "Trailer"), head)
        assert.equal("hello world", rest)
    end)
end)
