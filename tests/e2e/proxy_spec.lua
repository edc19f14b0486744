-- Reverse proxying end to end: the real binary in front of the fault upstream. Each test checks what the client
-- got and what reached the upstream (up:hits() / up:stats()).
package.path = "tests/e2e/?.lua;" .. package.path
local H = require("helpers")
local socket = require("socket")

local json = H.json

---------------------------------------------------------------------------
-- small utilities
---------------------------------------------------------------------------

local function to_hex(s)
    return (s:gsub(".", function(ch) return ("%02x"):format(ch:byte()) end))
end

local text_body = H.text_body
local socket_time = require("socket").gettime

local function all_bytes(reps)
    local t = {}
    for i = 0, 255 do t[#t + 1] = string.char(i) end
    return table.concat(t):rep(reps or 1)
end

local hit_values = H.hit_values

local function hit_has(hit, name)
    return #hit_values(hit, name) > 0
end

local rss_kb = H.rss_kib

local function read_lines(path)
    local s = H.read_file(path) or ""
    local out = {}
    for line in s:gmatch("([^\n]+)\n") do out[#out + 1] = line end
    return out
end

-- Reads what arrives on conn until n responses parse (or the deadline); returns the parsed list.
local function read_n_responses(conn, n, timeout, methods)
    local deadline = socket.gettime() + (timeout or 5)
    local data = ""
    for _ = 1, 100000 do
        local list = H.parse_responses(data, { methods = methods })
        if #list >= n then return list, data end
        local more, err = conn.reader.fill(deadline)
        if not more then return H.parse_responses(data, { methods = methods }), data, err end
        data = data .. more
    end
    return H.parse_responses(data, { methods = methods }), data
end

-- These tests are about proxying, one attempt per request. A binary that has the retry layer gets it switched off
-- (its kill switch), so a 502/504 here is the proxy's own answer, not the end of a retry schedule.
local retries_directive
local function knows_retries()
    if retries_directive == nil then
        local _, out = H.run({ H.bin(), "--directives" }, { timeout = 10 })
        retries_directive = ("\n" .. (out or "")):find("\nretries\t", 1, true) ~= nil
    end
    return retries_directive
end

local function start_gw(conf, opts)
    opts = opts or {}
    if knows_retries() then
        conf = conf:gsub("\nhttp {\n", "\nhttp {\n    retries off;\n", 1)
    end
    opts.conf = conf
    return H.start_gateway(opts)
end

-- A gateway log that fails a test shows up in its message.
local ctx = H.context

---------------------------------------------------------------------------
-- one gateway and upstream shared by the plain proxying tests
---------------------------------------------------------------------------

local MAIN = [[
worker_processes 1;
error_log logs/error.log info;
http {
    access_log {{PREFIX}}/logs/access.log;
    upstream backend {
        server {{UPSTREAM}};
        keepalive 8;
    }
    server {
        listen 127.0.0.1:{{PORT}};
        client_max_body_size 1m;
        proxy_set_header X-Server-Level yes;
        location / {
            proxy_pass http://backend;
        }
        location /direct/ {
            proxy_pass http://{{UPSTREAM}};
        }
        location /small-buffer/ {
            proxy_pass http://backend;
            client_body_buffer_size 4k;
            client_max_body_size 2m;
        }
        location /slow/ {
            proxy_pass http://backend;
            proxy_read_timeout 1s;
        }
        location /hdr/ {
            proxy_pass http://backend;
            proxy_set_header Host $http_host;
            proxy_set_header X-Real-IP $remote_addr;
            proxy_set_header X-Via "$scheme://$host$request_uri $request_method";
            proxy_set_header X-Copy $http_x_custom_thing;
            proxy_set_header X-Port $remote_port;
            proxy_set_header X-Proxy-Host $proxy_host;
            proxy_set_header X-All-Fwd $proxy_add_x_forwarded_for;
            proxy_set_header User-Agent "";
            proxy_set_header X-Missing $http_x_not_sent;
        }
    }
}
]]

describe("proxying through a shared gateway", function()
    local up, gw

    setup(function()
        up = H.start_upstream()
        gw = start_gw(MAIN, { upstream = up })
    end)

    teardown(function()
        if gw then gw:stop() end
        if up then up:stop() end
    end)

    before_each(function()
        up:reset()
    end)

    -- responses ------------------------------------------------------------

    it("passes a 64 KiB response intact", function()
        up:program({ default = { status = 200, body_size = 65536, headers = { ["Content-Type"] = "application/x-test" } } })
        local resp, err = H.request(gw.port, { path = "/big64" })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(200, resp.status)
        assert.equal("65536", resp.headers["content-length"])
        assert.equal("application/x-test", resp.headers["content-type"])
        assert.equal(65536, #resp.body)
        assert.is_true(resp.body == H.body_of_size(65536), "64 KiB body differs")
        local hits = up:hits()
        assert.equal(1, #hits)
        assert.equal("GET", hits[1].method)
        assert.equal("/big64", hits[1].target)
    end)

    it("passes a 1 MiB response intact", function()
        local n = 1024 * 1024
        up:program({ default = { status = 200, body_size = n } })
        local resp, err = H.request(gw.port, { path = "/big1m", timeout = 10 })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(200, resp.status)
        assert.equal(n, #resp.body)
        assert.is_true(resp.body == H.body_of_size(n), "1 MiB body differs")
        assert.equal(1, up:stats().hits)
    end)

    -- a body past the first read goes socket to socket through a pipe (spliced): in order,
    -- whole, counted in the access log, and the upstream connection is pooled after it
    it("relays the rest of a large body spliced: intact, logged whole, both connections kept", function()
        local n = 3 * 1024 * 1024 + 7
        local path = gw.prefix .. "/logs/access.log"
        local base = #read_lines(path)
        up:program({ routes = { ["/spliced"] = { default = { status = 200, body_size = n } },
            ["/after"] = { default = { status = 200, body = "after" } } } })
        local conn = assert(H.connect(gw.port))
        local resp, err = conn:request({ path = "/spliced", timeout = 20 })
        local before = up:stats().connections
        assert.truthy(resp, ctx(gw, err))
        assert.equal(200, resp.status)
        assert.equal(n, #resp.body)
        assert.is_true(resp.body == H.body_of_size(n), "the spliced body differs")
        local again, err2 = conn:request({ path = "/after" })
        conn:close()
        assert.truthy(again, ctx(gw, err2))
        assert.equal("after", again.body)
        assert.equal(before, up:stats().connections, "the upstream connection was not reused after the body")
        local entry = H.wait_until(function()
            local lines = read_lines(path)
            return #lines >= base + 2 and json.decode(lines[base + 1])
        end, 5)
        assert.truthy(entry, ctx(gw, "no access log line"))
        assert.equal("/spliced", entry.path)
        assert.is_true(entry.bytes > n and entry.bytes < n + 1024, "bytes logged: " .. tostring(entry.bytes))
    end)

    it("passes a chunked response as chunked to an HTTP/1.1 client", function()
        local n = 100000
        up:program({ default = { status = 200, body_size = n, chunked = true, chunk_size = 1000 } })
        local data, closed = H.raw(gw.port, "GET /chunky HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            { timeout = 5 })
        assert.is_true(closed, ctx(gw))
        local list, perr = H.parse_responses(data)
        assert.equal(1, #list, tostring(perr))
        local resp = list[1]
        assert.equal(200, resp.status)
        assert.is_true(resp.chunked, "the response reached the client without chunked framing")
        assert.is_nil(resp.headers["content-length"])
        assert.equal(n, #resp.body)
        assert.is_true(resp.body == H.body_of_size(n), "chunked body differs")
        -- the upstream's chunks go through as they were framed
        assert.truthy(data:find("\r\n3e8\r\n", 1, true), "upstream chunk framing not passed through")
        assert.equal(1, up:stats().hits)
    end)

    it("de-chunks a chunked response for an HTTP/1.0 client and closes", function()
        local n = 100000
        up:program({ default = { status = 200, body_size = n, chunked = true, chunk_size = 1000 } })
        local data, closed, err = H.raw(gw.port, "GET /chunky10 HTTP/1.0\r\nHost: x\r\n\r\n", { timeout = 5 })
        assert.is_true(closed, ctx(gw, err))
        local head, body = data:match("^(.-\r\n)\r\n(.*)$")
        assert.truthy(head, "no response head in: " .. data:sub(1, 200))
        assert.matches("^HTTP/1%.[01] 200", head)
        assert.is_nil(head:lower():find("transfer%-encoding"), "HTTP/1.0 client got Transfer-Encoding:\n" .. head)
        assert.equal(n, #body)
        assert.is_true(body == H.body_of_size(n), "de-chunked body differs (chunk framing left in?)")
        local hit = up:hits()[1]
        assert.equal("HTTP/1.1", hit.version)
    end)

    it("answers HEAD without a body, keeping the connection usable", function()
        up:program({ routes = { ["/head"] = { default = { status = 200, body_size = 5000 } },
            ["/after"] = { default = { status = 200, body = "after-head" } } } })
        local conn = assert(H.connect(gw.port))
        local r1, err = conn:request({ method = "HEAD", path = "/head" })
        assert.truthy(r1, ctx(gw, err))
        assert.equal(200, r1.status)
        assert.equal("", r1.body)
        assert.equal("5000", r1.headers["content-length"])
        -- had the gateway sent (or waited for) a body, the next answer would be garbled or late
        local r2, err2 = conn:request({ path = "/after" })
        assert.truthy(r2, ctx(gw, err2))
        assert.equal("after-head", r2.body)
        assert.equal("", conn.reader.buf)
        conn:close()
        local hits = up:hits()
        assert.equal(2, #hits)
        assert.equal("HEAD", hits[1].method)
    end)

    it("answers 204 and 304 without a body", function()
        up:program({ routes = {
            ["/204"] = { default = { status = 204, headers = { ["X-A"] = "1" } } },
            -- a 304 may carry the Content-Length of the representation: it describes no body here
            ["/304"] = { default = { status = 304, headers = { ["Content-Length"] = "100", ETag = '"v1"' } } },
            ["/200"] = { default = { status = 200, body = "plain" } },
        } })
        local conn = assert(H.connect(gw.port))
        local r1, e1 = conn:request({ path = "/204" })
        assert.truthy(r1, ctx(gw, e1))
        assert.equal(204, r1.status)
        assert.equal("1", r1.headers["x-a"])
        assert.equal("", conn.reader.buf)
        local r2, e2 = conn:request({ path = "/304", timeout = 3 })
        assert.truthy(r2, ctx(gw, e2))
        assert.equal(304, r2.status)
        assert.equal('"v1"', r2.headers["etag"])
        assert.is_nil(r2.headers["transfer-encoding"])
        assert.equal("", conn.reader.buf)
        local r3, e3 = conn:request({ path = "/200" })
        assert.truthy(r3, ctx(gw, e3))
        assert.equal("plain", r3.body)
        conn:close()
        assert.equal(3, up:stats().hits)
    end)

    -- request bodies ---------------------------------------------------------

    it("sends a Content-Length POST body upstream byte for byte", function()
        local body = text_body(20000, 7)
        local resp, err = H.request(gw.port, { method = "POST", path = "/post", body = body,
            headers = { { "Content-Type", "text/plain" } } })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(200, resp.status)
        local hit = up:hits()[1]
        assert.equal("POST", hit.method)
        assert.equal(tostring(#body), hit.header_map["content-length"])
        assert.is_false(hit.chunked)
        assert.equal(#body, hit.body_len)
        assert.is_true(hit.body == body, "POST body differs upstream")
        assert.equal("text/plain", hit.header_map["content-type"])
    end)

    it("sends a chunked request body upstream decoded, with Content-Length", function()
        local body = text_body(30000, 9)
        local resp, err = H.request(gw.port, { method = "PUT", path = "/chunked-up", body = body,
            chunked = true, chunk_size = 777 })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(200, resp.status)
        local hit = up:hits()[1]
        assert.is_false(hit.chunked, "upstream got a chunked body")
        assert.is_false(hit_has(hit, "transfer-encoding"))
        assert.equal(tostring(#body), hit.header_map["content-length"])
        assert.is_true(hit.body == body, "decoded body differs upstream")
    end)

    it("sends a binary body with all 256 byte values intact", function()
        local body = all_bytes(4)
        local resp, err = H.request(gw.port, { method = "POST", path = "/binary", body = body,
            headers = { { "Content-Type", "application/octet-stream" } } })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(200, resp.status)
        local hit = up:hits()[1]
        assert.equal(1024, hit.body_len)
        assert.equal(to_hex(body), hit.body_hex)
    end)

    it("sends a body larger than client_body_buffer_size (temp file) intact", function()
        local body = text_body(300 * 1024, 3)
        local resp, err = H.request(gw.port, { method = "POST", path = "/small-buffer/up", body = body,
            timeout = 10 })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(200, resp.status)
        local hit = up:hits()[1]
        assert.equal(tostring(#body), hit.header_map["content-length"])
        assert.equal(#body, hit.body_len)
        assert.is_true(hit.body == body, "a body spilled to the temp file differs upstream")
        -- the same, chunked from the client
        up:reset()
        local resp2, err2 = H.request(gw.port, { method = "POST", path = "/small-buffer/chunked", body = body,
            chunked = true, chunk_size = 5000, timeout = 10 })
        assert.truthy(resp2, ctx(gw, err2))
        assert.equal(200, resp2.status)
        local hit2 = up:hits()[1]
        assert.equal(tostring(#body), hit2.header_map["content-length"])
        assert.is_true(hit2.body == body, "a chunked body spilled to the temp file differs upstream")
    end)

    -- client connections ------------------------------------------------------

    it("serves two requests on one client connection", function()
        up:program({ routes = { ["/one"] = { default = { body = "first" } },
            ["/two"] = { default = { body = "second" } } } })
        local conn = assert(H.connect(gw.port))
        local r1, e1 = conn:request({ path = "/one" })
        assert.truthy(r1, ctx(gw, e1))
        local r2, e2 = conn:request({ method = "POST", path = "/two", body = "xyz" })
        assert.truthy(r2, ctx(gw, e2))
        assert.equal("first", r1.body)
        assert.equal("second", r2.body)
        assert.is_false(conn:closed(0.1))
        conn:close()
        local hits = up:hits()
        assert.equal(2, #hits)
        assert.equal("/one", hits[1].path)
        assert.equal("xyz", hits[2].body)
    end)

    it("answers pipelined requests in order", function()
        up:program({ routes = {
            ["/p1"] = { default = { body = "one", delay_ms = 150 } },
            ["/p2"] = { default = { body = "two" } },
            ["/p3"] = { default = { body_size = 40000 } },
            ["/p4"] = { default = { body = "four" } },
        } })
        local bytes = H.build_request(gw.port, { path = "/p1" })
            .. H.build_request(gw.port, { method = "POST", path = "/p2", body = "pipelined body" })
            .. H.build_request(gw.port, { path = "/p3" })
            .. H.build_request(gw.port, { method = "HEAD", path = "/p4" })
        local conn = assert(H.connect(gw.port))
        assert(conn:send(bytes))
        local list, _, err = read_n_responses(conn, 4, 5, { nil, nil, nil, "HEAD" })
        conn:close()
        assert.equal(4, #list, ctx(gw, err))
        assert.equal("one", list[1].body)
        assert.equal("two", list[2].body)
        assert.is_true(list[3].body == H.body_of_size(40000))
        assert.equal(200, list[4].status)
        assert.equal("", list[4].body)
        local hits = up:hits()
        assert.equal(4, #hits)
        assert.equal("pipelined body", hits[2].body)
    end)

    -- failures ----------------------------------------------------------------

    it("answers 504 when the upstream is silent past proxy_read_timeout", function()
        up:program({ default = { silent = true } })
        local resp, err = H.request(gw.port, { path = "/slow/x", timeout = 15 })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(504, resp.status)
        assert.equal(1, up:stats().hits) -- the request did reach it
        -- the timed-out connection is not reused: the next request gets a fresh one and works
        up:program({ default = { body = "back" } })
        local resp2, err2 = H.request(gw.port, { path = "/slow/y" })
        assert.truthy(resp2, ctx(gw, err2))
        assert.equal("back", resp2.body)
        local hits = up:hits()
        assert.are_not.equal(hits[1].conn, hits[2].conn)
    end)

    local broken = {
        ["two differing Content-Length fields"] =
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
        ["Content-Length with Transfer-Encoding"] =
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        ["a bad chunk size in the first read"] =
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
    }
    for name, raw in pairs(broken) do
        it("answers 502 for " .. name .. " and never reuses that connection", function()
            -- the upstream keeps the broken connection open: reuse would show as the same conn id
            up:program({ routes = { ["/broken"] = { default = { raw = raw } },
                ["/good"] = { default = { body = "good" } } } })
            local resp, err = H.request(gw.port, { path = "/broken", timeout = 5 })
            assert.truthy(resp, ctx(gw, err))
            assert.equal(502, resp.status)
            assert.is_nil(resp.body:find("hello", 1, true), "the broken body reached the client")
            local resp2, err2 = H.request(gw.port, { path = "/good" })
            assert.truthy(resp2, ctx(gw, err2))
            assert.equal("good", resp2.body)
            local hits = up:hits()
            assert.equal(2, #hits)
            assert.are_not.equal(hits[1].conn, hits[2].conn, "the broken upstream connection was reused")
        end)
    end

    -- headers -------------------------------------------------------------------

    it("removes hop-by-hop headers in both directions", function()
        up:program({ default = { status = 200, body = "hop", headers = {
            { "Connection", "X-Up" }, { "X-Up", "1" }, { "Keep-Alive", "timeout=5" }, { "X-Keep", "yes" },
            { "Proxy-Authenticate", "Basic" }, { "Trailer", "X-T" },
        } } })
        local resp, err = H.request(gw.port, { path = "/hop", headers = {
            { "Connection", "X-Secret" }, { "X-Secret", "1" }, { "Keep-Alive", "300" }, { "TE", "trailers" },
            { "Proxy-Authorization", "Basic c2VjcmV0" }, { "Proxy-Connection", "keep-alive" },
            { "X-Normal", "kept" },
        } })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(200, resp.status)
        assert.equal("hop", resp.body)
        local hit = up:hits()[1]
        for _, name in ipairs({ "X-Secret", "Keep-Alive", "TE", "Proxy-Authorization", "Proxy-Connection" }) do
            assert.is_false(hit_has(hit, name), name .. " reached the upstream")
        end
        for _, v in ipairs(hit_values(hit, "Connection")) do
            assert.is_nil(v:lower():find("x-secret"), "the client's Connection field reached the upstream")
        end
        assert.equal("kept", hit.header_map["x-normal"])
        -- and back
        assert.is_nil(resp.headers["x-up"], "X-Up (named by Connection) reached the client")
        assert.is_nil(resp.headers["keep-alive"], "Keep-Alive reached the client")
        assert.is_nil(resp.headers["proxy-authenticate"])
        assert.is_nil(resp.headers["trailer"])
        for _, v in ipairs(H.header_values(resp, "connection")) do
            assert.is_nil(v:lower():find("x%-up"), "the upstream's Connection field reached the client")
        end
        assert.equal("yes", resp.headers["x-keep"])
    end)

    it("appends to X-Forwarded-For and sets X-Forwarded-Proto", function()
        local resp, err = H.request(gw.port, { path = "/xff", headers = {
            { "X-Forwarded-For", "10.0.0.1" }, { "X-Forwarded-Proto", "https" } } })
        assert.truthy(resp, ctx(gw, err))
        local resp2 = assert(H.request(gw.port, { path = "/xff2" }))
        assert.equal(200, resp2.status)
        local hits = up:hits()
        assert.same({ "10.0.0.1, 127.0.0.1" }, hit_values(hits[1], "X-Forwarded-For"))
        assert.same({ "127.0.0.1" }, hit_values(hits[2], "X-Forwarded-For"))
        assert.same({ "http" }, hit_values(hits[2], "X-Forwarded-Proto"))
        -- "set", not "added": a client's own X-Forwarded-Proto must not reach the upstream beside ours
        assert.same({ "http" }, hit_values(hits[1], "X-Forwarded-Proto"))
    end)

    it("applies proxy_set_header with variables, and an empty value removes the header", function()
        local conn = assert(H.connect(gw.port))
        local _, local_port = conn.sock:getsockname()
        local resp, err = conn:request({ path = "/hdr/x?y=1", headers = {
            { "Host", "Example.TEST:1234" }, { "User-Agent", "client/1.0" }, { "X-Custom-Thing", "abc" },
            { "X-Forwarded-For", "10.9.8.7" },
        } })
        conn:close()
        assert.truthy(resp, ctx(gw, err))
        assert.equal(200, resp.status)
        local hit = up:hits()[1]
        assert.same({ "Example.TEST:1234" }, hit_values(hit, "Host"))
        assert.same({ "127.0.0.1" }, hit_values(hit, "X-Real-IP"))
        assert.same({ "http://example.test/hdr/x?y=1 GET" }, hit_values(hit, "X-Via"))
        assert.same({ "abc" }, hit_values(hit, "X-Copy"))
        assert.same({ tostring(local_port) }, hit_values(hit, "X-Port"))
        assert.same({ "backend" }, hit_values(hit, "X-Proxy-Host"))
        assert.same({ "10.9.8.7, 127.0.0.1" }, hit_values(hit, "X-All-Fwd"))
        assert.same({}, hit_values(hit, "User-Agent"), "an empty proxy_set_header value must drop the header")
        assert.same({}, hit_values(hit, "X-Missing"), "a variable that is empty must drop the header")
        -- a location with its own proxy_set_header does not inherit the server's (nginx semantics)
        assert.same({}, hit_values(hit, "X-Server-Level"))
    end)

    it("inherits a server-level proxy_set_header in a location without its own", function()
        assert.equal(200, assert(H.request(gw.port, { path = "/inherit" })).status)
        assert.same({ "yes" }, hit_values(up:hits()[1], "X-Server-Level"))
    end)

    it("passes every original header, Authorization included, in order; Host is the upstream's", function()
        local sent = {
            { "Authorization", "Bearer s3cr3t-token" }, { "Cookie", "a=1; b=2" }, { "Accept", "*/*" },
            { "X-Dup", "1" }, { "x-dup", "2" }, { "X-Empty", "" }, { "Accept-Encoding", "gzip" },
            { "If-None-Match", '"etag"' }, { "X-Spaced", "v a l" },
        }
        local resp, err = H.request(gw.port, { path = "/all?q=%20x", headers = sent })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(200, resp.status)
        local hit = up:hits()[1]
        assert.equal("/all?q=%20x", hit.target)
        -- the gateway may add fields of its own: compare only the names the client sent
        local names = {}
        for _, h in ipairs(sent) do names[h[1]:lower()] = true end
        local got = {}
        for _, h in ipairs(hit.headers) do
            if names[h[1]:lower()] then got[#got + 1] = { h[1], h[2] } end
        end
        assert.same(sent, got)
        assert.same({ "backend" }, hit_values(hit, "Host"))
        -- with proxy_pass to an address, Host is that address
        up:reset()
        assert(H.request(gw.port, { path = "/direct/x" }))
        assert.same({ up.addr }, hit_values(up:hits()[1], "Host"))
    end)

    it("does not reuse a connection whose response carried bytes past Content-Length", function()
        up:program({ routes = { ["/extra"] = { default = { raw = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA" } },
            ["/good"] = { default = { body = "good" } } } })
        local conn = assert(H.connect(gw.port))
        local r1, e1 = conn:request({ path = "/extra" })
        assert.truthy(r1, ctx(gw, e1))
        assert.equal("ok", r1.body)
        local r2, e2 = conn:request({ path = "/good" })
        assert.truthy(r2, ctx(gw, e2))
        assert.equal("good", r2.body)
        assert.equal("", conn.reader.buf, "bytes past Content-Length reached the client")
        conn:close()
        local hits = up:hits()
        assert.are_not.equal(hits[1].conn, hits[2].conn)
    end)

    it("does not reuse a connection whose spliced body had bytes past Content-Length", function()
        local body = H.body_of_size(100000) -- past the first read: the rest is spliced
        up:program({ routes = { ["/extra-big"] = { default = {
                raw = "HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" .. body .. "EXTRA" } },
            ["/good"] = { default = { body = "good" } } } })
        -- pipelined: the second is sent upstream in the same turn the first ends in, before
        -- the pooled connection's own event could tell what followed the body
        local conn = assert(H.connect(gw.port))
        assert(conn:send(H.build_request(gw.port, { path = "/extra-big" })
            .. H.build_request(gw.port, { path = "/good" })))
        local list, _, err = read_n_responses(conn, 2, 10)
        conn:close()
        assert.equal(2, #list, ctx(gw, err))
        assert.is_true(list[1].body == body, "the spliced body differs")
        assert.equal(200, list[2].status, ctx(gw))
        assert.equal("good", list[2].body)
        local hits = up:hits()
        assert.equal(2, #hits)
        assert.are_not.equal(hits[1].conn, hits[2].conn)
    end)

    it("relays a close-delimited response and then closes the client connection", function()
        local body = text_body(50000, 5)
        up:program({ default = { raw = "HTTP/1.1 200 OK\r\nX-Framing: none\r\n\r\n" .. body, close = true } })
        local conn = assert(H.connect(gw.port))
        local resp, err = conn:request({ path = "/eof" })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(200, resp.status)
        assert.equal("none", resp.headers["x-framing"])
        assert.is_true(resp.body == body, "close-delimited body differs")
        assert.truthy(conn:closed(10), "the client connection stayed open after a close-delimited body")
        conn:close()
    end)

    it("drops interim 1xx answers and relays the final one", function()
        up:program({ default = { status = 200, body = "final",
            interim = { { status = 103, headers = { Link = "</s.css>; rel=preload" } } } } })
        local resp, err = H.request(gw.port, { path = "/hints" })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(200, resp.status)
        assert.equal("final", resp.body)
    end)

    it("reduces an absolute-form target to origin-form upstream", function()
        local resp, err = H.request(gw.port, { path = "http://127.0.0.1:" .. gw.port .. "/abs/p?q=1" })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(200, resp.status)
        local hit = up:hits()[1]
        assert.equal("/abs/p?q=1", hit.target)
        assert.same({ "backend" }, hit_values(hit, "Host"))
    end)

    it("sends '/?q' upstream for an absolute-form target with a query and no path", function()
        local resp, err = H.request(gw.port, { path = "http://127.0.0.1:" .. gw.port .. "?x=1" })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(200, resp.status)
        assert.equal("/?x=1", up:hits()[1].target)
    end)

    it("matches locations on the normalized path; the original target goes upstream", function()
        -- /small-buffer/ raises client_max_body_size to 2m: a 1.5m body is only accepted there
        local body = ("z"):rep(1536 * 1024)
        for _, path in ipairs({ "/x/../small-buffer/a", "//small-buffer//a", "/%73mall-buffer/a",
                                "/x/%2e%2e/small-buffer/./a" }) do
            local resp, err = H.request(gw.port, { method = "POST", path = path, body = body })
            assert.truthy(resp, ctx(gw, err))
            assert.equal(200, resp.status, path)
        end
        local targets = {}
        for _, h in ipairs(up:hits()) do targets[#targets + 1] = h.target end
        assert.same({ "/x/../small-buffer/a", "//small-buffer//a", "/%73mall-buffer/a",
                      "/x/%2e%2e/small-buffer/./a" }, targets)
        -- the plain prefix location keeps its 1m limit
        local resp = assert(H.request(gw.port, { method = "POST", path = "/plain", body = body }))
        assert.equal(413, resp.status)
    end)

    it("answers 400 to a path that climbs above the root or carries a bad escape", function()
        for _, path in ipairs({ "/../etc/passwd", "/a/../../b", "/%zz", "/a%00b", "/%2e%2e/x" }) do
            local out, closed = H.raw(gw.port, "GET " .. path .. " HTTP/1.1\r\nHost: a\r\n\r\n")
            assert.matches("^HTTP/1%.1 400", out, path)
            assert.is_true(closed, path)
        end
        assert.equal(0, up:stats().hits)
    end)

    it("answers 502 for an upstream response head over the limit", function()
        up:program({ default = { status = 200, body = "x", headers = { ["X-Big"] = ("h"):rep(40000) } } })
        local resp, err = H.request(gw.port, { path = "/bighead" })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(502, resp.status)
    end)

    it("answers 502 when the upstream resets before the head, cuts the client off after it", function()
        up:program({ routes = { ["/rst1"] = { default = { reset = "before_head" } },
            ["/rst2"] = { default = { body_size = 200000, reset = "mid_body" } } } })
        local r1, e1 = H.request(gw.port, { path = "/rst1" })
        assert.truthy(r1, ctx(gw, e1))
        assert.equal(502, r1.status)
        local conn = assert(H.connect(gw.port))
        local r2, e2, partial = conn:request({ path = "/rst2" })
        assert.is_nil(r2, "a truncated body arrived as a complete response")
        assert.truthy(partial and partial.status == 200, "no head before the cut: " .. tostring(e2))
        assert.is_true(#partial.body < 200000)
        assert.truthy(conn:closed(10), "the client connection stayed open after a truncated body")
        conn:close()
    end)

    it("cuts the client off when the upstream stalls mid-body past proxy_read_timeout", function()
        -- the next piece comes after 30 s: 30 times proxy_read_timeout
        up:program({ default = { body_size = 100000, chunked = true, chunk_size = 10000, chunk_delay_ms = 30000 } })
        local conn = assert(H.connect(gw.port))
        local resp, err, partial = conn:request({ path = "/slow/body", timeout = 15 })
        assert.is_nil(resp, "a stalled body arrived as a complete response")
        assert.truthy(partial and partial.status == 200, ctx(gw, tostring(err)))
        assert.truthy(conn:closed(10), "the client connection stayed open")
        conn:close()
    end)

    it("serves concurrent clients, each on its own upstream connection", function()
        -- each answer takes 3 s: all ten are in flight at once even when a busy machine is slow to send them
        up:program({ default = { body = "slowish", delay_ms = 3000 } })
        local conns = {}
        for i = 1, 10 do
            conns[i] = assert(H.connect(gw.port))
            assert(conns[i]:send(H.build_request(gw.port, { path = "/c" .. i })))
        end
        for i = 1, 10 do
            local resp, err = conns[i]:read_response({ timeout = 20 })
            conns[i]:close()
            assert.truthy(resp, ctx(gw, err))
            assert.equal("slowish", resp.body)
        end
        local hits = up:hits()
        assert.equal(10, #hits)
        local ids, n = {}, 0
        for _, h in ipairs(hits) do
            if not ids[h.conn] then n = n + 1 end
            ids[h.conn] = true
        end
        assert.equal(10, n)
    end)

    it("keeps an HTTP/1.0 keep-alive client connection open across proxied requests", function()
        local conn = assert(H.connect(gw.port))
        local r1, e1 = conn:request({ path = "/k1", version = "HTTP/1.0", headers = { { "Connection", "keep-alive" } } })
        assert.truthy(r1, ctx(gw, e1))
        assert.equal("keep-alive", (r1.headers.connection or ""):lower())
        local r2, e2 = conn:request({ path = "/k2", version = "HTTP/1.0" })
        assert.truthy(r2, ctx(gw, e2))
        assert.equal(200, r2.status)
        assert.truthy(conn:closed(10), "HTTP/1.0 without keep-alive must close")
        conn:close()
    end)

    it("keeps going after a client that disconnects mid-response", function()
        up:program({ routes = { ["/huge"] = { default = { body_size = 4 * 1024 * 1024 } } } })
        local conn = assert(H.connect(gw.port))
        assert(conn:send(H.build_request(gw.port, { path = "/huge" })))
        local head = conn.reader:head(socket.gettime() + 5, 65536)
        assert.truthy(head, ctx(gw))
        conn:close()
        local resp, err = H.request(gw.port, { path = "/after-abort" })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(200, resp.status)
        assert.equal(1, #gw:workers())
    end)
end)

---------------------------------------------------------------------------
-- upstream connection reuse
---------------------------------------------------------------------------

local POOL = [[
worker_processes 1;
error_log logs/error.log info;
http {
    upstream backend {
        server {{UPSTREAM}};
        keepalive {{KEEPALIVE}};
        keepalive_timeout {{KTIMEOUT}};
    }
    server {
        listen 127.0.0.1:{{PORT}};
        location / { proxy_pass http://backend; }
    }
}
]]

describe("upstream keep-alive", function()
    local up, gw

    before_each(function()
        up = H.start_upstream()
    end)

    after_each(function()
        if gw then gw:stop() end
        gw = nil
        if up then up:stop() end
    end)

    it("reuses upstream connections across client connections", function()
        gw = start_gw(POOL, { upstream = up, vars = { KEEPALIVE = 4, KTIMEOUT = "60s" } })
        for i = 1, 6 do
            local resp, err = H.request(gw.port, { path = "/r" .. i })
            assert.truthy(resp, ctx(gw, err))
            assert.equal(200, resp.status)
        end
        local stats = up:stats()
        assert.equal(6, stats.hits)
        assert.is_true(stats.connections < 6, "no upstream connection was reused: " .. stats.connections)
        assert.equal(1, stats.connections)
    end)

    it("opens one upstream connection per request with keepalive 0", function()
        gw = start_gw(POOL, { upstream = up, vars = { KEEPALIVE = 0, KTIMEOUT = "60s" } })
        for i = 1, 4 do
            local resp, err = H.request(gw.port, { path = "/r" .. i })
            assert.truthy(resp, ctx(gw, err))
            assert.equal(200, resp.status)
        end
        local stats = up:stats()
        assert.equal(4, stats.hits)
        assert.equal(4, stats.connections)
        local ids = {}
        for _, hit in ipairs(up:hits()) do
            assert.is_nil(ids[hit.conn], "an upstream connection carried two requests")
            ids[hit.conn] = true
        end
    end)

    it("recovers when the upstream closes a pooled connection", function()
        gw = start_gw(POOL, { upstream = up, vars = { KEEPALIVE = 4, KTIMEOUT = "60s" } })
        -- a keep-alive looking answer, then the upstream closes the connection while it sits in the pool
        up:program({ sequence = { { raw = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst", close = true },
            { close = true, body = "second" } }, default = { body = "third" } })
        local r1, e1 = H.request(gw.port, { path = "/a" })
        assert.truthy(r1, ctx(gw, e1))
        assert.equal("first", r1.body)
        H.sleep(0.3)
        local r2, e2 = H.request(gw.port, { path = "/b" })
        assert.truthy(r2, ctx(gw, e2))
        assert.equal(200, r2.status)
        assert.equal("second", r2.body)
        -- the second answer said Connection: close: the next request needs (and gets) a new connection too
        local r3, e3 = H.request(gw.port, { path = "/c" })
        assert.truthy(r3, ctx(gw, e3))
        assert.equal("third", r3.body)
        local hits = up:hits()
        assert.equal(3, #hits)
        assert.are_not.equal(hits[1].conn, hits[2].conn)
        assert.are_not.equal(hits[2].conn, hits[3].conn)
        assert.equal(3, up:stats().connections)
    end)

    it("closes pooled upstream connections after the upstream keepalive_timeout", function()
        -- 3 s: the look right after the answer still finds the connection open on a busy machine
        gw = start_gw(POOL, { upstream = up, vars = { KEEPALIVE = 4, KTIMEOUT = "3s" } })
        local r1, e1 = H.request(gw.port, { path = "/a" })
        assert.truthy(r1, ctx(gw, e1))
        assert.equal(1, up:stats().open_connections)
        assert.truthy(H.wait_until(function() return up:stats().open_connections == 0 end, 20),
            "the idle upstream connection outlived keepalive_timeout")
        local r2, e2 = H.request(gw.port, { path = "/b" })
        assert.truthy(r2, ctx(gw, e2))
        assert.equal(200, r2.status)
        assert.equal(2, up:stats().connections)
    end)

    it("finishes an in-flight proxied request on SIGQUIT, then exits", function()
        gw = start_gw(POOL, { upstream = up, vars = { KEEPALIVE = 4, KTIMEOUT = "60s" } })
        -- the answer takes 5 s: the QUIT comes while the request is upstream however busy the machine
        up:program({ default = { body = "late answer", delay_ms = 5000 } })
        local conn = assert(H.connect(gw.port))
        assert(conn:send(H.build_request(gw.port, { path = "/inflight" })))
        assert.truthy(H.wait_until(function() return up:stats().hits == 1 end, 10))
        gw:signal("QUIT")
        local resp, err = conn:read_response({ timeout = 20 })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(200, resp.status)
        assert.equal("late answer", resp.body)
        assert.equal("close", resp.headers.connection)
        conn:close()
        assert.truthy(gw:wait_exit(15), "the gateway did not exit after its last request")
        assert.equal(0, gw.exit_code)
    end)

    it("lets an exchange outlast client_header_timeout and client_body_timeout", function()
        -- the client's own timers stop once its request has been read
        local conf = [[
worker_processes 1;
error_log logs/error.log info;
http {
    client_header_timeout 1s;
    client_body_timeout 1s;
    upstream backend { server {{UPSTREAM}}; }
    server { listen 127.0.0.1:{{PORT}}; location / { proxy_pass http://backend; proxy_read_timeout 10s; } }
}
]]
        local g = start_gw(conf, { upstream = up })
        up:program({ default = { status = 200, body = "late", delay_ms = 2500 } })
        local resp, err = H.request(g.port, { method = "POST", path = "/slow-answer", body = "x", timeout = 20 })
        assert.truthy(resp, ctx(g, err))
        assert.equal(200, resp.status)
        assert.equal("late", resp.body)
        g:stop()
    end)

    it("refuses new connections once SIGQUIT has begun a graceful stop", function()
        local g = start_gw([[
worker_processes 1;
http { upstream backend { server {{UPSTREAM}}; } server { listen 127.0.0.1:{{PORT}};
    per_try_timeout 60s; retry_timeout 120s; location / { proxy_pass http://backend; } } }
]], { upstream = up })
        -- the answer takes 10 s: the listener is looked at while the request is upstream; the
        -- attempt's and the request's bounds are 6 and 12 times that, so only the answer ends it
        up:program({ default = { status = 200, body = "slow", delay_ms = 10000 } })
        local conn = assert(H.connect(g.port))
        assert(conn:send("GET /in-flight HTTP/1.1\r\nHost: a\r\n\r\n"))
        assert.truthy(H.wait_until(function() return up:stats().hits == 1 end, 10))
        g:signal("QUIT")
        assert.truthy(H.wait_until(function()
            local c = H.connect(g.port, { timeout = 0.5 })
            if c then c:close() return false end
            return true
        end, 5), "the listener still accepted connections during the graceful stop")
        assert.is_false((conn:closed(0)), "the request ended before the listener was looked at")
        assert.equal("", conn.reader.buf, "the request ended before the listener was looked at")
        local resp = assert(conn:read_response({ timeout = 20 }))
        assert.equal(200, resp.status)
        assert.truthy(g:wait_exit(15))
        g:stop()
    end)

    it("keeps worker memory bounded for a slow client of a 20 MiB response", function()
        local n = 20 * 1024 * 1024
        gw = start_gw(POOL, { upstream = up, vars = { KEEPALIVE = 4, KTIMEOUT = "60s" } })
        up:program({ routes = { ["/huge"] = { default = { body_size = n } } } })
        assert.equal(200, assert(H.request(gw.port, { path = "/warm" })).status)
        local workers = gw:workers()
        assert.equal(1, #workers)
        local worker = workers[1]
        local before = assert(rss_kb(worker))
        local conn = assert(H.connect(gw.port))
        assert(conn:send(H.build_request(gw.port, { path = "/huge" })))
        assert.truthy(H.wait_until(function() return up:stats().hits == 2 end, 20), ctx(gw, "/huge never went up"))
        H.sleep(2) -- the client reads nothing meanwhile
        local stalled = assert(rss_kb(worker))
        local grew = (stalled - before) / 1024
        assert.is_true(grew < 8, ("worker RSS grew by %.1f MiB while the client stalled"):format(grew))
        local resp, err = conn:read_response({ timeout = 30 })
        conn:close()
        assert.truthy(resp, ctx(gw, err))
        assert.equal(200, resp.status)
        assert.equal(n, #resp.body)
        assert.is_true(resp.body == H.body_of_size(n), "20 MiB body differs")
    end)
end)

---------------------------------------------------------------------------
-- no upstream answer
---------------------------------------------------------------------------

local DEAD = [[
worker_processes 1;
error_log logs/error.log info;
http {
    access_log {{PREFIX}}/logs/access.log;
    upstream live { server {{UPSTREAM}}; }
    server {
        listen 127.0.0.1:{{PORT}};
        location /ok/ { proxy_pass http://live; }
        location /dead/ { proxy_pass http://127.0.0.1:{{DEADPORT}}; }
        location /sink/ {
            proxy_pass http://127.0.0.1:{{SINKPORT}};
            proxy_send_timeout 1s;
            client_max_body_size 32m;
        }
        location /blackhole/ {
            proxy_pass http://127.0.0.1:{{HOLEPORT}};
            proxy_connect_timeout 1s;
        }
    }
}
]]

describe("without an upstream answer", function()
    local up, gw, hole, filler, sink

    setup(function()
        up = H.start_upstream()
        -- a listener whose accept queue (backlog 0) is full: further SYNs are dropped, connects hang
        hole = assert(socket.tcp())
        assert(hole:bind("127.0.0.1", 0))
        assert(hole:listen(0))
        local _, hole_port = hole:getsockname()
        filler = assert(socket.tcp())
        filler:settimeout(1)
        assert(filler:connect("127.0.0.1", hole_port))
        -- a listener that never accepts nor reads: once its queues fill, the gateway's sends block
        sink = assert(socket.tcp())
        assert(sink:bind("127.0.0.1", 0))
        assert(sink:listen(8))
        local _, sink_port = sink:getsockname()
        gw = start_gw(DEAD, { upstream = up,
            vars = { DEADPORT = H.dead_port(), HOLEPORT = hole_port, SINKPORT = sink_port } })
    end)

    teardown(function()
        if gw then gw:stop() end
        if up then up:stop() end
        if filler then filler:close() end
        if hole then hole:close() end
        if sink then sink:close() end
    end)

    it("answers 502 when nothing listens on the upstream port", function()
        local resp, err = H.request(gw.port, { path = "/dead/x" })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(502, resp.status)
        -- and the connection stays usable
        local conn = assert(H.connect(gw.port))
        assert.equal(502, assert(conn:request({ path = "/dead/y" })).status)
        assert.equal(200, assert(conn:request({ path = "/ok/z" })).status)
        conn:close()
    end)

    it("answers 504 when the connect does not finish within proxy_connect_timeout", function()
        -- make sure the trick works here before blaming the gateway
        local probe = socket.tcp()
        probe:settimeout(0.3)
        local _, hole_port = hole:getsockname()
        local ok = probe:connect("127.0.0.1", hole_port)
        probe:close()
        if ok then
            pending("a full accept queue does not stall connects on this kernel")
            return
        end
        local resp, err = H.request(gw.port, { path = "/blackhole/x", timeout = 20 })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(504, resp.status)
    end)

    it("answers 504 when the upstream takes no request bytes within proxy_send_timeout", function()
        local body = H.body_of_size(12 * 1024 * 1024)
        local resp, err = H.request(gw.port, { method = "POST", path = "/sink/x", body = body, timeout = 20 })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(504, resp.status)
    end)

    it("logs a proxied 200 and a 502 to the access log as JSON lines", function()
        local path = gw.prefix .. "/logs/access.log"
        local base = #read_lines(path)
        up:reset()
        assert.equal(200, assert(H.request(gw.port, { path = "/ok/logged?a=1" })).status)
        assert.equal(502, assert(H.request(gw.port, { path = "/dead/logged" })).status)
        local lines = H.wait_until(function()
            local l = read_lines(path)
            return #l >= base + 2 and l
        end, 3)
        assert.truthy(lines, "access log lines missing:\n" .. (H.read_file(path) or ""))
        local ok1, e1 = pcall(json.decode, lines[base + 1])
        local ok2, e2 = pcall(json.decode, lines[base + 2])
        assert.truthy(ok1, "not JSON: " .. lines[base + 1])
        assert.truthy(ok2, "not JSON: " .. lines[base + 2])
        for _, e in ipairs({ e1, e2 }) do
            for _, f in ipairs({ "time", "client", "method", "path", "host", "status", "bytes", "duration",
                "upstream", "attempts" }) do
                assert.is_not_nil(e[f], "access log field missing: " .. f .. " in " .. json.encode(e))
            end
            assert.equal("GET", e.method)
            assert.matches("^127%.0%.0%.1:%d+$", e.client)
            assert.equal("table", type(e.attempts))
        end
        assert.equal(200, e1.status)
        assert.equal("/ok/logged?a=1", e1.path)
        assert.equal("127.0.0.1:" .. gw.port, e1.host)
        assert.equal(up.addr, e1.upstream)
        assert.is_true(e1.bytes > 0)
        assert.equal(1, #e1.attempts)
        assert.equal(up.addr, e1.attempts[1].server)
        assert.equal("status", e1.attempts[1].class)
        assert.equal(200, e1.attempts[1].status)
        assert.is_number(e1.attempts[1].duration)
        assert.is_number(e1.attempts[1].wait)

        assert.equal(502, e2.status)
        assert.equal("/dead/logged", e2.path)
        assert.equal(1, #e2.attempts)
        assert.equal(gw.vars.DEADPORT and ("127.0.0.1:" .. gw.vars.DEADPORT), e2.attempts[1].server)
        assert.equal("connect_error", e2.attempts[1].class)
        -- the 502 did go out: the gateway counts its own 404s' bytes, so it should count this one's too
        assert.is_true(e2.bytes > 0, "bytes of the gateway's own 502 logged as " .. tostring(e2.bytes))
    end)
end)

---------------------------------------------------------------------------
-- routing and balancing
---------------------------------------------------------------------------

local ROUTES = [[
worker_processes 1;
error_log logs/error.log info;
http {
    upstream a { server {{UPSTREAM1}}; }
    upstream b { server {{UPSTREAM2}}; }
    server {
        listen 127.0.0.1:{{PORT}} default_server;
        server_name a.test;
        location = /exact { proxy_pass http://a; }
        location /ex { proxy_pass http://b; }
        location / { }
    }
    server {
        listen 127.0.0.1:{{PORT}};
        server_name b.test *.wild.test;
        location / { proxy_pass http://b; }
        location /exact { proxy_pass http://a; }
    }
}
]]

local WEIGHTS = [[
worker_processes 1;
error_log logs/error.log info;
http {
    upstream pair {
        server {{UPSTREAM1}} weight=3;
        server {{UPSTREAM2}} weight=1;
    }
    server {
        listen 127.0.0.1:{{PORT}};
        location / { proxy_pass http://pair; }
    }
}
]]

describe("routing", function()
    local a, b, gw

    before_each(function()
        a = H.start_upstream()
        b = H.start_upstream()
        a:program({ default = { body = "from-a" } })
        b:program({ default = { body = "from-b" } })
    end)

    after_each(function()
        if gw then gw:stop() end
        gw = nil
        if a then a:stop() end
        if b then b:stop() end
    end)

    it("picks the server by Host and the location by exact match, then longest prefix", function()
        gw = start_gw(ROUTES, { upstreams = { a, b } })
        local cases = {
            { "a.test", "/exact", "from-a" },
            { "A.TEST:8080", "/exact?x=1", "from-a" },
            { "a.test", "/exact/more", "from-b" },
            { "a.test", "/exactly", "from-b" },
            { "a.test", "/other", 404 },
            { "b.test", "/other", "from-b" },
            { "b.test", "/exact/x", "from-a" },
            { "x.wild.test", "/w", "from-b" },
            { "wild.test", "/w", 404 },          -- *.wild.test does not match wild.test: default server
            { "unknown.test", "/exact", "from-a" }, -- default server
        }
        for _, c in ipairs(cases) do
            local resp, err = H.request(gw.port, { path = c[2], headers = { { "Host", c[1] } } })
            assert.truthy(resp, ctx(gw, err))
            local what = c[1] .. c[2]
            if type(c[3]) == "number" then
                assert.equal(c[3], resp.status, what)
            else
                assert.equal(200, resp.status, what)
                assert.equal(c[3], resp.body, what)
            end
        end
        local pa, pb = {}, {}
        for _, h in ipairs(a:hits()) do pa[#pa + 1] = h.target end
        for _, h in ipairs(b:hits()) do pb[#pb + 1] = h.target end
        assert.same({ "/exact", "/exact?x=1", "/exact/x", "/exact" }, pa)
        assert.same({ "/exact/more", "/exactly", "/other", "/w" }, pb)
    end)

    it("balances by weight: 3 to 1 over 8 requests is 6 and 2", function()
        gw = start_gw(WEIGHTS, { upstreams = { a, b } })
        local order = {}
        for i = 1, 8 do
            local resp, err = H.request(gw.port, { path = "/w" .. i })
            assert.truthy(resp, ctx(gw, err))
            assert.equal(200, resp.status)
            order[#order + 1] = resp.body == "from-a" and "a" or "b"
        end
        assert.equal(6, a:stats().hits, table.concat(order, " "))
        assert.equal(2, b:stats().hits, table.concat(order, " "))
        -- smooth weighted round robin spreads the light server out: never b twice in a row
        assert.is_nil(table.concat(order):find("bb"), table.concat(order, " "))
    end)
end)

---------------------------------------------------------------------------
-- bodies over retry_body_max stream through while the upstream answers
---------------------------------------------------------------------------

describe("streamed request bodies", function()
    local up, gw

    setup(function()
        up = H.start_upstream()
        gw = start_gw([[
worker_processes 1;
error_log logs/error.log info;
http {
    retry_body_max 1k;
    client_max_body_size 10m;
    client_body_timeout 1s;
    proxy_read_timeout 1s;
    upstream backend { server {{UPSTREAM}}; }
    server {
        listen 127.0.0.1:{{PORT}};
        location / { proxy_pass http://backend; }
        location /patient/ { proxy_pass http://backend; proxy_read_timeout 5s; }
    }
}
]], { upstream = up })
    end)

    teardown(function()
        if gw then gw:stop() end
        if up then up:stop() end
    end)

    before_each(function()
        up:reset()
    end)

    -- the head and the first part of the body at once, the rest in slow pieces, so that the
    -- upstream's early bytes arrive while the request is still going up
    local function slow_put(path, body)
        local head = ("PUT %s HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n"):format(path, #body)
        local pieces = { head .. body:sub(1, 2048) }
        for i = 2049, #body, 4096 do pieces[#pieces + 1] = body:sub(i, i + 4095) end
        return H.raw(gw.port, table.concat(pieces), { pieces = pieces, pause = 0.05, timeout = 8,
            ["until"] = "\r\n\r\n.*" })
    end

    it("keeps sending the body after an interim 100 Continue from the upstream", function()
        -- /patient/: the upload's 0.5 s, which a busy machine stretches, is far below its 5 s proxy_read_timeout
        up:program({ routes = { ["/patient/continue"] = { default = { early = "HTTP/1.1 100 Continue\r\n\r\n",
            status = 200, body = "got it" } } } })
        local body = text_body(40 * 1024)
        local out = slow_put("/patient/continue", body)
        assert.truthy(H.wait_until(function() return up:stats().hits == 1 end, 15), ctx(gw))
        local hit = up:hits()[1]
        assert.equal(#body, hit.body_len, ctx(gw))
        assert.is_true(hit.body == body, "the upstream got a different body")
        assert.matches("^HTTP/1%.1 200", out or "")
    end)

    it("bounds a streamed request whose response head stalls half-way", function()
        up:program({ routes = { ["/stall"] = { default = { early = "HTTP/1.1 200 OK\r\n", early_hold = true } } } })
        local t0 = socket_time()
        local out = slow_put("/stall", text_body(40 * 1024))
        assert.matches("^HTTP/1%.1 504", out or "", ctx(gw))
        assert.is_true(socket_time() - t0 < 7, "the stalled head held the request too long")
    end)

    it("writes nothing of its own into an early answer while the client's body stalls", function()
        up:program({ routes = { ["/patient/early"] = { default = {
            early = "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhello", early_hold = true } } } })
        local conn = assert(H.connect(gw.port))
        assert(conn:send("PUT /patient/early HTTP/1.1\r\nHost: a\r\nContent-Length: 100000\r\n\r\n"
            .. ("x"):rep(2048)))
        -- the client sends nothing more; the answer's body stalls too. client_body_timeout (1s)
        -- runs out first, and must not put a 408 inside the answer
        local data = conn:read_all(3)
        conn:close()
        assert.matches("^HTTP/1%.1 200", data, ctx(gw))
        assert.is_nil(data:find("408", 1, true), "a 408 landed in the answer: " .. data)
    end)
end)
