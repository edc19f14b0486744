-- A keyed request whose body streams (over retry_body_max) and whose client leaves: once the whole body is in,
-- the gateway finishes the request and stores its answer, as for a held body; a client that only half-closed
-- still reads the answer; a client that leaves mid-body gets its key released. The upstream is a server in
-- this spec: it counts the complete bodies it receives and holds its answer until the spec releases it, so
-- every step happens in the order the spec sets, whatever the machine's speed.
package.path = "tests/e2e/?.lua;" .. package.path
local H = require("helpers")
local I = require("idem_helpers")
local socket = require("socket")

local ctx = H.context
local gettime = socket.gettime

local BODY = H.text_body(64 * 1024, 34) -- streams: retry_body_max is 1k below

local CONF = [[
worker_processes 1;
error_log logs/error.log info;
http {
    access_log logs/access.log;
    upstream up { server {{UPSTREAM}}; retry_budget off; }
    server {
        listen 127.0.0.1:{{PORT}};
        retry_body_max 1k;
        idempotency_store lmdb:{{STORE}};
        location / { proxy_pass http://up; }
    }
}
]]

---------------------------------------------------------------------------
-- The held upstream: reads requests whole (Content-Length), answers each complete one with
-- 201 {"run":N} and Connection: close once released.
---------------------------------------------------------------------------

local Up = {}
Up.__index = Up

local function new_upstream()
    local srv = assert(socket.bind("127.0.0.1", 0))
    srv:settimeout(0)
    local _, port = srv:getsockname()
    return setmetatable({ srv = srv, port = tonumber(port), conns = {}, held = true,
        complete = 0, partial_closed = 0, bodies = {} }, Up)
end

function Up:reset()
    for _, c in ipairs(self.conns) do c.sock:close() end
    self.conns, self.held, self.complete, self.partial_closed, self.bodies = {}, true, 0, 0, {}
    self.long, self.hold_rest = nil, false
end

function Up:close()
    self:reset()
    self.srv:close()
end

-- One request's bytes arrived on c: its head, then its body by Content-Length.
local function take(self, c, data)
    c.buf = c.buf .. data
    if not c.len then
        local e = c.buf:find("\r\n\r\n", 1, true)
        if not e then return end
        c.len = tonumber(c.buf:sub(1, e):lower():match("\ncontent%-length:%s*(%d+)")) or 0
        c.buf = c.buf:sub(e + 4)
    end
    if not c.done and #c.buf >= c.len then
        c.done = true
        self.complete = self.complete + 1 -- an execution: the whole request is here
        self.bodies[#self.bodies + 1] = c.buf:sub(1, c.len)
    end
end

-- The answer: {"run":N}, or self.long (its first half sent, the rest when self.hold_rest is false).
local function answer(self, c)
    local body = self.long or ('{"run":%d}'):format(self.complete)
    local now = self.long and body:sub(1, #body / 2) or body
    c.sock:settimeout(2)
    c.sock:send(("HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
        .. "Connection: close\r\n\r\n%s"):format(#body, now)) -- a gateway that left makes this fail: fine
    c.sock:settimeout(0)
    c.answered, c.rest = true, body:sub(#now + 1)
end

local function answer_rest(self, c)
    c.sock:settimeout(2)
    if c.rest ~= "" then c.sock:send(c.rest) end
    c.sock:close()
    c.closed, c.rest = true, ""
end

-- Waits up to t seconds for the sockets to move, then moves every connection along.
function Up:pump(t)
    local rd = { self.srv }
    for _, c in ipairs(self.conns) do
        if not c.closed then rd[#rd + 1] = c.sock end
    end
    socket.select(rd, nil, t)
    for _ = 1, 16 do
        local s = self.srv:accept()
        if not s then break end
        s:settimeout(0)
        self.conns[#self.conns + 1] = { sock = s, buf = "" }
    end
    for _, c in ipairs(self.conns) do
        if not c.closed then
            local data, err, part = c.sock:receive(1024 * 1024)
            data = data or part
            if data and #data > 0 then take(self, c, data) end
            if err == "closed" then
                c.closed = true
                c.sock:close()
                if not c.done then self.partial_closed = self.partial_closed + 1 end
            end
        end
        if c.done and not c.answered and not c.closed and not self.held then answer(self, c) end
        if c.answered and not c.closed and not self.hold_rest then answer_rest(self, c) end
    end
end

-- Pumps until fn() is truthy or `seconds` pass (every loop bounded in count and time); returns fn()'s value.
function Up:until_(fn, seconds)
    local deadline = gettime() + seconds
    for _ = 1, math.ceil(seconds / 0.01) + 10 do
        local v = fn()
        if v or gettime() >= deadline then return v end
        self:pump(0.01)
    end
    return fn()
end

---------------------------------------------------------------------------
-- Clients, driven with the upstream pumped between their steps.
---------------------------------------------------------------------------

local function keyed_request(port, key, body)
    return H.build_request(port, { method = "POST", path = "/pay", body = body,
        headers = { { "Idempotency-Key", key }, { "Content-Type", "application/octet-stream" } } })
end

local function connect(port)
    local s = socket.tcp()
    s:settimeout(3)
    assert(s:connect("127.0.0.1", port))
    s:settimeout(0)
    return s
end

-- Sends all of bytes on s, the upstream pumped while the gateway is behind (bounded: 20 s).
local function send_all(up, s, bytes)
    local i, deadline = 1, gettime() + 20
    for _ = 1, 100000 do
        if i > #bytes or gettime() >= deadline then break end
        local last, err, partial = s:send(bytes, i)
        i = (last or partial or i - 1) + 1
        if not last and err ~= "timeout" then return nil, err end
        if i <= #bytes then up:pump(0.01) end
    end
    return i > #bytes or nil, "timeout"
end

-- Reads one response from s, the upstream pumped meanwhile (bounded: seconds). Returns it, or nil, err.
local function read_answer(up, s, seconds)
    local buf, closed = "", false
    local got = up:until_(function()
        local data, err, part = s:receive(1024 * 1024)
        data = data or part
        if data and #data > 0 then buf = buf .. data end
        closed = closed or err == "closed"
        local list = H.parse_responses(buf)
        return list[1] or (closed and "closed") or nil
    end, seconds or 10)
    if type(got) ~= "table" then return nil, got or "timeout" end
    return got
end

-- A whole keyed request and its answer on a new connection.
local function request(up, port, key, body)
    local s = connect(port)
    local ok, err = send_all(up, s, keyed_request(port, key, body))
    local resp
    if ok then resp, err = read_answer(up, s, 10) end
    s:close()
    return resp, err
end

-- A repeat once the first request's answer is being stored: a 409 "in use" is retried (bounded: 15 s).
local function repeat_request(up, port, key, body)
    local last
    up:until_(function()
        last = request(up, port, key, body)
        return not (last and last.status == 409 and last.body:find("idempotency-key-in-use", 1, true))
    end, 15)
    return last
end

local function log_has(gw, file, pattern)
    return (H.read_file(gw.prefix .. "/logs/" .. file) or ""):find(pattern) ~= nil
end

-- The gateway saw the client go: an end of stream (a half-close, or a close not known yet as one), a reset
-- read, or a write that failed; the lines of this build and of one that cut the request.
local function saw_client_end(gw)
    return log_has(gw, "error.log", "ended its side of the connection")
        or log_has(gw, "error.log", "client closed the connection while waiting for the answer")
        or log_has(gw, "error.log", "client went away while being sent the answer")
end

describe("a keyed request whose body streams", function()
    local up, gw, dir

    setup(function()
        up = new_upstream()
        dir = H.mkdtemp("idem-stream")
    end)

    teardown(function()
        if up then up:close() end
        if dir then os.execute("rm -rf " .. H.shell_quote(dir)) end
    end)

    before_each(function()
        up:reset()
        -- a gateway each: its error log tells about this case's client only
        gw = H.start_gateway({ conf = CONF, upstream = up.port, vars = { STORE = dir .. "/idem.mdb" } })
    end)

    after_each(function()
        if gw then gw:stop() end
        gw = nil
    end)

    -- The first request's answer was stored: a repeat gets it, replayed, and the upstream ran it once.
    local function assert_replayed(key)
        local again = repeat_request(up, gw.port, key, BODY)
        assert.truthy(again, ctx(gw, "the repeat got no answer"))
        assert.equal(201, again.status, ctx(gw, again.body))
        assert.equal('{"run":1}', again.body)
        assert.equal("true", again.headers["idempotent-replayed"], ctx(gw))
        assert.equal(1, up.complete, ctx(gw))
        assert.equal(#BODY, #up.bodies[1])
        assert.truthy(up.bodies[1] == BODY, "the upstream got another body")
        assert.truthy(log_has(gw, "access.log", '"idempotency":"stored"'), ctx(gw))
    end

    it("finishes and stores it when the client closes right after its last byte", function()
        local key = I.new_key("close")
        local s = connect(gw.port)
        assert(send_all(up, s, keyed_request(gw.port, key, BODY)))
        s:close() -- at once: the gateway may not have sent the end of the body upstream yet
        -- the upstream takes the body at its pace, and answers only once the gateway saw the client go
        assert.truthy(up:until_(function() return saw_client_end(gw) end, 20), ctx(gw))
        up.held = false
        assert.truthy(up:until_(function() return up.complete == 1 and up.conns[1].answered end, 20),
            ctx(gw, "the upstream never got the whole body, or the gateway cut it"))
        assert_replayed(key)
    end)

    it("answers a client that half-closed after its last byte, and stores the answer", function()
        local key = I.new_key("half")
        local s = connect(gw.port)
        assert(send_all(up, s, keyed_request(gw.port, key, BODY)))
        s:shutdown("send") -- done sending; still reading
        assert.truthy(up:until_(function() return saw_client_end(gw) end, 20), ctx(gw))
        up.held = false
        local resp, err = read_answer(up, s, 20)
        s:close()
        assert.truthy(resp, ctx(gw, "the half-closed client got no answer: " .. tostring(err)))
        assert.equal(201, resp.status)
        assert.equal('{"run":1}', resp.body)
        assert.is_nil(resp.headers["idempotent-replayed"])
        assert_replayed(key)
        assert.truthy(log_has(gw, "access.log", '"status":201[^\n]*"idempotency":"stored"'), ctx(gw))
    end)

    it("finishes and stores it when the client leaves while the upstream holds its answer", function()
        local key = I.new_key("wait")
        local s = connect(gw.port)
        assert(send_all(up, s, keyed_request(gw.port, key, BODY)))
        -- the upstream has the whole request, and holds its answer
        assert.truthy(up:until_(function() return up.complete == 1 end, 20), ctx(gw))
        s:close()
        assert.truthy(up:until_(function() return saw_client_end(gw) end, 20), ctx(gw))
        up.held = false
        assert.truthy(up:until_(function() return up.conns[1].answered end, 20), ctx(gw))
        assert_replayed(key)
    end)

    it("finishes and stores it when the client leaves while the answer is relayed", function()
        local key = I.new_key("relay")
        up.long, up.hold_rest = H.text_body(64 * 1024, 7), true
        local s = connect(gw.port)
        assert(send_all(up, s, keyed_request(gw.port, key, BODY)))
        up.held = false
        -- the answer's head and half its body reach the client; the rest waits at the upstream
        local buf = ""
        assert.truthy(up:until_(function()
            local data, _, part = s:receive(1024 * 1024)
            buf = buf .. (data or part or "")
            local e = buf:find("\r\n\r\n", 1, true)
            return e and #buf > e + 3
        end, 20), ctx(gw, "no answer began"))
        s:close()
        assert.truthy(up:until_(function() return saw_client_end(gw) end, 20), ctx(gw))
        up.hold_rest = false
        local again = repeat_request(up, gw.port, key, BODY)
        assert.truthy(again, ctx(gw, "the repeat got no answer"))
        assert.equal(201, again.status, ctx(gw, again.body))
        assert.truthy(again.body == up.long, ctx(gw, "the replay is not the whole answer"))
        assert.equal("true", again.headers["idempotent-replayed"])
        assert.equal(1, up.complete)
    end)

    it("releases the key when the client leaves mid-body, and closes the upstream connection", function()
        local key = I.new_key("mid")
        local s = connect(gw.port)
        local whole = keyed_request(gw.port, key, BODY)
        assert(send_all(up, s, whole:sub(1, #whole - #BODY / 2)))
        -- the upstream is getting the request: it has its head and part of its body
        assert.truthy(up:until_(function() return up.conns[1] and up.conns[1].len and #up.conns[1].buf > 0 end,
            20), ctx(gw))
        s:close()
        -- the incomplete request's connection is closed, never reused for another request
        assert.truthy(up:until_(function() return up.partial_closed == 1 end, 20), ctx(gw))
        assert.equal(0, up.complete)
        assert.truthy(up:until_(function() return log_has(gw, "access.log", '"idempotency":"released"') end, 20),
            ctx(gw))
        -- the key is free: the repeat runs, once, and its answer is stored
        up.held = false
        local first = repeat_request(up, gw.port, key, BODY)
        assert.truthy(first, ctx(gw))
        assert.equal(201, first.status, ctx(gw, first.body))
        assert.is_nil(first.headers["idempotent-replayed"])
        assert_replayed(key)
        assert.equal(2, #up.conns) -- the cut one, and the repeat's own
    end)
end)
