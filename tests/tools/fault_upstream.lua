-- Fault-injecting HTTP/1.1 origin for ricochet e2e tests: answers as programmed over /__fault/ and records every request.
--
-- Usage: luajit tests/tools/fault_upstream.lua [--port N] [--host 127.0.0.1] [--max-seconds N] [--verbose]
-- Prints "listening HOST:PORT" once ready. Control API (never recorded as hits):
--   POST /__fault/program  {"default": R, "sequence": [R...], "cycle": bool, "routes": {"/p": {"default": R, "sequence": [R...]}},
--                           "merge": false}
--   GET  /__fault/hits[?since=N&bodies=0]   POST /__fault/reset   GET /__fault/stats
--   POST /__fault/release {"name": NAME}    opens the gate NAME: answers that hold on it go on (until a reset)
-- R (a response) fields: status reason headers body body_hex body_size chunked chunk_size chunk_delay_ms trailers
--   delay_ms body_delay_ms reset("before_head"|"after_head"|"mid_body") reset_delay_ms close raw raw_hex silent
--   (raw may be a list of pieces, sent apart: body_delay_ms after the first, chunk_delay_ms between the others)
--   echo interim([R...], 1xx sent before the final head), early (raw bytes sent as soon as the request head is
--   read, before its body), early_hold (after early: hold the connection, never answer), hold_file (the
--   answer waits until this file exists, at most 60 s: a spec releases it). A bare number is shorthand for
--   {"status": N}. hold (a gate's name): the answer waits, before delay_ms, until the gate is
--   released (at most 300 s), so a test decides when it comes without guessing a delay.

local socket = require("socket")
local cjson = require("cjson")

local gettime = socket.gettime

local MAX_HEAD = 64 * 1024         -- larger request heads are answered 400: nobody needs more in these tests
local RECV_SIZE = 1024 * 1024      -- read whatever is available, up to this much, per wakeup
local BODY_PATTERN = "0123456789abcdef"
local LINGER_DRAIN_SECONDS = 2     -- how long a polite close keeps reading so unread bytes don't turn FIN into RST
local DEFAULT_RESPONSE = { status = 200, body = "ok\n" }

local REASONS = {
    [100] = "Continue", [101] = "Switching Protocols", [103] = "Early Hints",
    [200] = "OK", [201] = "Created", [202] = "Accepted", [204] = "No Content", [206] = "Partial Content",
    [301] = "Moved Permanently", [302] = "Found", [304] = "Not Modified", [307] = "Temporary Redirect",
    [400] = "Bad Request", [401] = "Unauthorized", [403] = "Forbidden", [404] = "Not Found",
    [405] = "Method Not Allowed", [408] = "Request Timeout", [409] = "Conflict", [411] = "Length Required",
    [413] = "Content Too Large", [429] = "Too Many Requests", [500] = "Internal Server Error",
    [501] = "Not Implemented", [502] = "Bad Gateway", [503] = "Service Unavailable", [504] = "Gateway Timeout",
}

local opts = { host = "127.0.0.1", port = 0, max_seconds = 300, verbose = false }

-- Server-wide state; reset() puts it back to this shape.
local state = {
    hits = {},          -- hit records in arrival order
    hit_n = 0,          -- last global hit number handed out
    epoch = 1,          -- bumped by reset, so "connections since reset" can be counted
    epoch_conns = {},   -- connections accepted or used since the last reset
    next_conn_id = 0,   -- never reset: ids must stay unique while old keep-alive connections live on
    program = nil,      -- set by new_program()
    released = {},      -- gates opened by /__fault/release: name -> true
}

local conns = {}        -- open connection objects (set)
local by_sock = {}      -- socket -> connection, for select results

local function log(fmt, ...)
    io.stderr:write(("fault_upstream: " .. fmt .. "\n"):format(...))
end

local function vlog(fmt, ...)
    if opts.verbose then log(fmt, ...) end
end

local function usage(msg)
    io.stderr:write("fault_upstream: ", msg, "\n",
        "usage: luajit fault_upstream.lua [--port N] [--host 127.0.0.1] [--max-seconds N] [--program FILE] [--verbose]\n")
    os.exit(2)
end

local function parse_args(argv)
    local i = 1
    while i <= #argv do
        local a, v = argv[i], argv[i + 1]
        if a == "--port" then opts.port = tonumber(v); i = i + 2
        elseif a == "--host" then opts.host = v; i = i + 2
        elseif a == "--max-seconds" then opts.max_seconds = tonumber(v); i = i + 2
        elseif a == "--verbose" or a == "-v" then opts.verbose = true; i = i + 1
        elseif a == "--program" then opts.program_file = v; i = i + 2
        else usage("unknown argument " .. tostring(a)) end
    end
    if not opts.port or not opts.max_seconds or not opts.host then usage("bad argument value") end
end

-- Deterministic filler so tests can rebuild the expected body without shipping it around.
local function gen_body(n)
    if n <= 0 then return "" end
    return BODY_PATTERN:rep(math.floor(n / #BODY_PATTERN) + 1):sub(1, n)
end

local function to_hex(s)
    return (s:gsub(".", function(ch) return ("%02x"):format(ch:byte()) end))
end

local function from_hex(h)
    return (h:gsub("%s", ""):gsub("%x%x", function(x) return string.char(tonumber(x, 16)) end))
end

-- cjson passes bytes >= 0x80 through untouched, which is fine for cjson readers but not strict JSON ones.
local function is_utf8(s)
    if not s:find("[\128-\255]") then return true end
    local i, n = 1, #s
    while i <= n do
        local c = s:byte(i)
        local len = c < 0x80 and 1 or (c >= 0xC2 and c <= 0xDF) and 2 or (c >= 0xE0 and c <= 0xEF) and 3
            or (c >= 0xF0 and c <= 0xF4) and 4 or nil
        if not len or i + len - 1 > n then return false end
        for k = i + 1, i + len - 1 do
            local cc = s:byte(k)
            if cc < 0x80 or cc > 0xBF then return false end
        end
        i = i + len
    end
    return true
end

local function null_to_nil(v)
    if v == cjson.null then return nil end
    return v
end

---------------------------------------------------------------------------
-- Cooperative I/O: connection coroutines yield with c.want / c.wake_at set; the loop in main() resumes them.
---------------------------------------------------------------------------

local function wait_io(c, want, deadline)
    c.want, c.wake_at = want, deadline
    coroutine.yield()
end

local function sleep_ms(c, ms)
    local wake = gettime() + (ms or 0) / 1000
    -- loop because the scheduler may resume us early (e.g. a stale readiness event)
    for _ = 1, 1e6 do
        if gettime() >= wake then return end
        wait_io(c, nil, wake)
    end
end

-- Returns some bytes, or nil and "closed"/"timeout"/other error; deadline is optional.
local function recv_some(c, deadline)
    for _ = 1, 1e9 do
        local data, err, partial = c.sock:receive(RECV_SIZE)
        data = data or partial
        if data and #data > 0 then return data end
        if err ~= "timeout" then return nil, err end
        if deadline and gettime() >= deadline then return nil, "timeout" end
        wait_io(c, "read", deadline)
    end
end

local function send_all(c, data)
    local i, n = 1, #data
    for _ = 1, 1e9 do
        if i > n then return true end
        local last, err, partial_last = c.sock:send(data, i)
        if last then
            i = last + 1
        elseif err == "timeout" then
            i = partial_last + 1
            if i <= n then wait_io(c, "write") end
        else
            return nil, err
        end
    end
end

-- Abortive close: SO_LINGER 0 makes close() send RST instead of FIN.
local function reset_close(c)
    c.sock:setoption("linger", { on = true, timeout = 0 })
    c.sock:close()
    c.sock_closed = true
end

-- Polite close: FIN first, then swallow what the peer still sends, because closing with unread data sends RST.
local function graceful_close(c)
    if c.sock_closed then return end
    c.sock:shutdown("send")
    local deadline = gettime() + LINGER_DRAIN_SECONDS
    for _ = 1, 1e6 do
        local data = recv_some(c, deadline)
        if not data then break end
    end
    c.sock:close()
    c.sock_closed = true
end

---------------------------------------------------------------------------
-- Request reading
---------------------------------------------------------------------------

local function bad_request(msg)
    error({ bad = true, msg = msg }, 0)
end

-- Pulls more bytes into c.buf; false once the peer is gone.
local function fill(c)
    local data, err = recv_some(c)
    if not data then
        c.eof_err = err
        return false
    end
    c.buf = c.buf .. data
    return true
end

-- Reads exactly n bytes (collecting pieces so big bodies don't cost quadratic copies); nil + partial on EOF.
local function read_exact(c, n)
    if #c.buf >= n then
        local out = c.buf:sub(1, n)
        c.buf = c.buf:sub(n + 1)
        return out
    end
    local parts, have = { c.buf }, #c.buf
    c.buf = ""
    for _ = 1, 1e9 do
        if have >= n then break end
        local data, err = recv_some(c)
        if not data then
            c.eof_err = err
            return nil, table.concat(parts)
        end
        parts[#parts + 1] = data
        have = have + #data
    end
    local all = table.concat(parts)
    c.buf = all:sub(n + 1)
    return all:sub(1, n)
end

-- Reads one line (without its CRLF/LF); nil on EOF.
local function read_line(c, limit)
    for _ = 1, 1e9 do
        local e = c.buf:find("\n", 1, true)
        if e then
            local line = c.buf:sub(1, e - 1):gsub("\r$", "")
            c.buf = c.buf:sub(e + 1)
            return line
        end
        if #c.buf > limit then bad_request("line too long") end
        if not fill(c) then return nil end
    end
end

local TOKEN = "[!#$%%&'*+%-.^_`|~%w]+"

local function parse_head(head)
    local lines = {}
    for line in (head .. "\n"):gmatch("(.-)\r?\n") do lines[#lines + 1] = line end
    local method, target, version = lines[1]:match("^(" .. TOKEN .. ") (%S+) (HTTP/%d%.%d)$")
    if not method then bad_request("bad request line") end
    local headers, map = {}, {}
    for i = 2, #lines do
        local line = lines[i]
        if line:find("^[ \t]") then bad_request("obsolete line folding") end
        local name, value = line:match("^(" .. TOKEN .. "):[ \t]*(.-)[ \t]*$")
        if not name then bad_request("bad header line") end
        headers[#headers + 1] = { name, value }
        map[name:lower()] = value
    end
    return method, target, version, headers, map
end

-- Reads up to the blank line ending the head; nil when the peer closed before a complete head.
local function read_head(c)
    -- RFC 9112 lets a server skip empty lines before a request line (clients add CRLF after bodies)
    for _ = 1, 1e9 do
        c.buf = c.buf:gsub("^[\r\n]+", "")
        local s, e = c.buf:find("\r?\n\r?\n")
        if s then
            local head = c.buf:sub(1, s - 1)
            c.buf = c.buf:sub(e + 1)
            return head
        end
        if #c.buf > MAX_HEAD then bad_request("request head too large") end
        if not fill(c) then
            if c.buf ~= "" then vlog("conn %d closed mid-head", c.id) end
            return nil
        end
    end
end

-- Decodes a chunked body; returns body, trailers, complete.
local function read_chunked(c)
    local parts, trailers = {}, {}
    for _ = 1, 1e9 do
        local line = read_line(c, 4096)
        if not line then return table.concat(parts), trailers, false end
        local hex = line:match("^(%x+)")
        local rest = hex and line:sub(#hex + 1)
        if not hex or #hex > 15 or not (rest == "" or rest:find("^[ \t]*;")) then bad_request("bad chunk size") end
        local size = tonumber(hex, 16)
        if size == 0 then
            for _ = 1, 1000 do
                local t = read_line(c, MAX_HEAD)
                if not t then return table.concat(parts), trailers, false end
                if t == "" then return table.concat(parts), trailers, true end
                local name, value = t:match("^(" .. TOKEN .. "):[ \t]*(.-)[ \t]*$")
                if not name then bad_request("bad trailer") end
                trailers[#trailers + 1] = { name, value }
            end
            bad_request("too many trailers")
        end
        local data, partial = read_exact(c, size)
        if not data then
            parts[#parts + 1] = partial
            return table.concat(parts), trailers, false
        end
        parts[#parts + 1] = data
        local crlf = read_line(c, 16)
        if crlf == nil then return table.concat(parts), trailers, false end
        if crlf ~= "" then bad_request("chunk not followed by CRLF") end
    end
end

local function wants_continue(version, map)
    return version == "HTTP/1.1" and map["expect"] and map["expect"]:lower() == "100-continue"
end

local peek_response -- defined with the programs below

-- Reads one request. Returns nil when the connection ended before a complete head.
local function read_request(c)
    local head = read_head(c)
    if not head then return nil end
    local method, target, version, headers, map = parse_head(head)
    local req = {
        method = method, target = target, version = version, headers = headers, header_map = map,
        body = "", chunked = false, complete = true,
    }
    local path = target:match("^%a[%w+.-]*://[^/]*(/[^?#]*)") or target:match("^([^?#]*)")
    req.path = path ~= "" and path or "/"
    req.query = target:match("%?([^#]*)")

    local te, cl = map["transfer-encoding"], map["content-length"]
    local length
    if te then
        if not te:lower():find("chunked%s*$") then bad_request("unsupported transfer-encoding") end
        req.chunked = true
    elseif cl then
        -- every Content-Length line must agree, or the framing is ambiguous
        for _, h in ipairs(headers) do
            if h[1]:lower() == "content-length" then
                if not h[2]:find("^%d+$") or #h[2] > 15 then bad_request("bad content-length") end
                if length and length ~= tonumber(h[2]) then bad_request("conflicting content-length") end
                length = tonumber(h[2])
            end
        end
    end
    local is_control = req.path:sub(1, 9) == "/__fault/"
    if not is_control then
        -- "early": bytes sent as soon as the head is read, before the body
        -- (an unasked 100 Continue, or the start of an answer); "early_hold"
        -- then holds the connection without reading or answering
        local r = peek_response(req.path)
        if r and r.early then
            if not send_all(c, r.early) then return nil end
            if r.early_hold then
                for _ = 1, 1e9 do
                    if not recv_some(c) then break end
                end
                return nil
            end
        end
    end
    if (req.chunked or (length or 0) > 0) and wants_continue(version, map) then
        local ok = send_all(c, "HTTP/1.1 100 Continue\r\n\r\n")
        if not ok then return nil end
        req.continue_sent = true
    end
    if req.chunked then
        local body, trailers, complete = read_chunked(c)
        req.body, req.trailers, req.complete = body, trailers, complete
    elseif length and length > 0 then
        local body, partial = read_exact(c, length)
        req.body = body or partial
        req.complete = body ~= nil
    end
    req.is_control = is_control
    return req
end

---------------------------------------------------------------------------
-- Programs
---------------------------------------------------------------------------

local RESET_MODES = { before_head = true, after_head = true, mid_body = true }

local function check_response(r, where)
    r = null_to_nil(r)
    if r == nil then return nil end
    if type(r) == "number" then return { status = r } end
    if type(r) ~= "table" then error(where .. ": response must be an object or a status number", 0) end
    local out = {}
    for k, v in pairs(r) do out[k] = null_to_nil(v) end
    if out.status ~= nil and (type(out.status) ~= "number" or out.status < 100 or out.status > 999) then
        error(where .. ": bad status", 0)
    end
    if out.reset ~= nil and not RESET_MODES[out.reset] then
        error(where .. ": reset must be before_head, after_head or mid_body", 0)
    end
    if out.headers ~= nil and type(out.headers) ~= "table" then error(where .. ": headers must be object or array", 0) end
    if out.body_size ~= nil and (type(out.body_size) ~= "number" or out.body_size < 0) then
        error(where .. ": bad body_size", 0)
    end
    if out.chunk_size ~= nil and (type(out.chunk_size) ~= "number" or out.chunk_size < 1) then
        error(where .. ": bad chunk_size", 0)
    end
    if out.interim ~= nil then
        local list = {}
        for i, ir in ipairs(out.interim) do list[i] = check_response(ir, where .. ".interim") end
        out.interim = list
    end
    return out
end

local function new_slot(spec, where)
    spec = null_to_nil(spec) or {}
    if type(spec) ~= "table" then error(where .. ": must be an object", 0) end
    local slot = { default = check_response(spec.default, where .. ".default"), sequence = {}, pos = 0,
        cycle = spec.cycle == true }
    for i, r in ipairs(null_to_nil(spec.sequence) or {}) do
        slot.sequence[i] = check_response(r, ("%s.sequence[%d]"):format(where, i))
    end
    return slot
end

local function empty_program()
    return { global = new_slot(nil, "program"), routes = {} }
end

-- Builds the new program from a control body; without "merge" it replaces everything (clean slate per call).
local function apply_program(body)
    local base = body.merge and state.program or empty_program()
    local prog = { global = base.global, routes = {} }
    for path, slot in pairs(base.routes) do prog.routes[path] = slot end
    if not body.merge or body.default ~= nil or body.sequence ~= nil then
        prog.global = new_slot({ default = body.default, sequence = body.sequence, cycle = body.cycle }, "program")
    end
    local routes = null_to_nil(body.routes)
    if routes ~= nil then
        if type(routes) ~= "table" then error("routes must be an object", 0) end
        for path, spec in pairs(routes) do prog.routes[path] = new_slot(spec, "routes[" .. path .. "]") end
    end
    state.program = prog
end

-- The n-th request to a slot gets sequence[n], then the slot default, then the global default.
-- The response the next request to path will get, without using it up.
function peek_response(path)
    local prog = state.program
    local slot = prog.routes[path] or prog.global
    local pos = slot.pos + 1
    if slot.cycle and #slot.sequence > 0 and pos > #slot.sequence then pos = 1 end
    return slot.sequence[pos] or slot.default or prog.global.default
end

local function pick_response(path)
    local prog = state.program
    local slot = prog.routes[path] or prog.global
    slot.pos = slot.pos + 1
    if slot.cycle and #slot.sequence > 0 and slot.pos > #slot.sequence then slot.pos = 1 end
    return slot.sequence[slot.pos] or slot.default or prog.global.default or DEFAULT_RESPONSE
end

---------------------------------------------------------------------------
-- Responses
---------------------------------------------------------------------------

-- headers may be an object (name -> value or list of values) or an array of [name, value] pairs.
local function header_list(h)
    local list = {}
    if h == nil then return list end
    if h[1] ~= nil or next(h) == nil then
        for _, p in ipairs(h) do list[#list + 1] = { tostring(p[1]), tostring(p[2]) } end
        return list
    end
    local names = {}
    for k in pairs(h) do names[#names + 1] = k end
    table.sort(names) -- object key order is lost in JSON decoding; sorting at least keeps it stable
    for _, k in ipairs(names) do
        local v = h[k]
        if type(v) == "table" then
            for _, x in ipairs(v) do list[#list + 1] = { k, tostring(x) } end
        else
            list[#list + 1] = { k, tostring(v) }
        end
    end
    return list
end

local function status_line(r)
    local status = math.floor(r.status or 200)
    return ("HTTP/1.1 %d %s\r\n"):format(status, r.reason or REASONS[status] or "Unknown")
end

local function interim_bytes(r)
    local out = { status_line(r) }
    for _, h in ipairs(header_list(r.headers)) do out[#out + 1] = h[1] .. ": " .. h[2] .. "\r\n" end
    out[#out + 1] = "\r\n"
    return table.concat(out)
end

local function record_json(rec)
    return cjson.encode(rec)
end

local function response_body(r, rec)
    if r.echo then return record_json(rec) end
    if r.body_size then return gen_body(math.floor(r.body_size)) end
    if r.body_hex then return from_hex(r.body_hex) end
    return r.body and tostring(r.body) or ""
end

local function split(s, size)
    local pieces = {}
    for i = 1, #s, size do pieces[#pieces + 1] = s:sub(i, i + size - 1) end
    return pieces
end

local function chunk_pieces(body, size, trailers)
    local pieces = {}
    for _, data in ipairs(split(body, size)) do
        pieces[#pieces + 1] = ("%x\r\n"):format(#data) .. data .. "\r\n"
    end
    local tail = { "0\r\n" }
    for _, h in ipairs(header_list(trailers)) do tail[#tail + 1] = h[1] .. ": " .. h[2] .. "\r\n" end
    tail[#tail + 1] = "\r\n"
    pieces[#pieces + 1] = table.concat(tail)
    return pieces
end

-- Returns head bytes and the body as a list of wire pieces.
local function build_response(r, req, rec, closing, keepalive10)
    if type(r.raw) == "table" then
        -- pieces sent apart (chunk_delay_ms between them): the first as the head, the rest as the body's
        return tostring(r.raw[1] or ""), { unpack(r.raw, 2) }
    end
    if r.raw or r.raw_hex then
        return r.raw_hex and from_hex(r.raw_hex) or tostring(r.raw), {}
    end
    local status = math.floor(r.status or 200)
    local bodiless_status = status < 200 or status == 204 or status == 304
    local body = response_body(r, rec)
    local hdrs = header_list(r.headers)
    local has = {}
    for _, h in ipairs(hdrs) do has[h[1]:lower()] = true end
    local out = { status_line(r) }
    for _, h in ipairs(hdrs) do out[#out + 1] = h[1] .. ": " .. h[2] .. "\r\n" end
    if r.echo and not has["content-type"] then out[#out + 1] = "Content-Type: application/json\r\n" end
    if r.chunked then
        if not has["transfer-encoding"] then out[#out + 1] = "Transfer-Encoding: chunked\r\n" end
    elseif not has["content-length"] and not bodiless_status then
        out[#out + 1] = "Content-Length: " .. #body .. "\r\n"
    end
    if not has["connection"] then
        if closing then out[#out + 1] = "Connection: close\r\n"
        elseif keepalive10 then out[#out + 1] = "Connection: keep-alive\r\n" end
    end
    out[#out + 1] = "X-Fault-Hit: " .. rec.n .. "\r\n\r\n"
    local head = table.concat(out)

    if req.method == "HEAD" or bodiless_status then return head, {} end
    local size = math.floor(r.chunk_size or 4096)
    if r.chunked then return head, chunk_pieces(body, size, r.trailers) end
    if body == "" then return head, {} end
    if r.chunk_delay_ms then return head, split(body, size) end
    return head, { body }
end

local function json_response(c, status, obj, closing)
    local body = type(obj) == "string" and obj or cjson.encode(obj)
    local head = status_line({ status = status })
        .. "Content-Type: application/json\r\nContent-Length: " .. #body .. "\r\n"
        .. (closing and "Connection: close\r\n" or "") .. "\r\n"
    return send_all(c, head .. body)
end

---------------------------------------------------------------------------
-- Hit recording
---------------------------------------------------------------------------

local function touch_conn(c)
    if c.epoch ~= state.epoch then
        c.epoch = state.epoch
        state.epoch_conns[#state.epoch_conns + 1] = c
    end
end

local function record_hit(c, req)
    state.hit_n = state.hit_n + 1
    touch_conn(c)
    local rec = {
        n = state.hit_n, conn = c.id, time = gettime(),
        method = req.method, target = req.target, path = req.path, query = req.query, version = req.version,
        headers = req.headers, header_map = req.header_map,
        body = req.body, body_len = #req.body, chunked = req.chunked,
    }
    if not is_utf8(req.body) then rec.body_hex = to_hex(req.body) end
    if req.trailers and #req.trailers > 0 then rec.trailers = req.trailers end
    if req.continue_sent then rec.continue_sent = true end
    if not req.complete then rec.incomplete = true end
    state.hits[#state.hits + 1] = rec
    vlog("hit %d conn %d %s %s%s", rec.n, c.id, req.method, req.target, req.complete and "" or " (incomplete)")
    return rec
end

---------------------------------------------------------------------------
-- Control API
---------------------------------------------------------------------------

local function stats()
    local total, open = 0, 0
    for _, c in ipairs(state.epoch_conns) do
        if not c.control then total = total + 1 end
    end
    for c in pairs(conns) do
        if not c.control then open = open + 1 end
    end
    return { hits = #state.hits, connections = total, open_connections = open }
end

local function query_arg(q, name)
    return q and q:match("[?&]?" .. name .. "=([^&]*)") or nil
end

local function hits_json(req)
    local since = tonumber(query_arg(req.query, "since")) or 0
    local bodies = query_arg(req.query, "bodies") ~= "0"
    local parts = {}
    for _, rec in ipairs(state.hits) do
        if rec.n > since then
            if bodies then
                parts[#parts + 1] = record_json(rec)
            else
                local copy = {}
                for k, v in pairs(rec) do copy[k] = v end
                copy.body, copy.body_hex = nil, nil
                parts[#parts + 1] = record_json(copy)
            end
        end
    end
    -- built by hand because cjson encodes an empty table as {}
    return "[" .. table.concat(parts, ",") .. "]"
end

local function do_reset()
    state.hits, state.hit_n = {}, 0
    state.epoch, state.epoch_conns = state.epoch + 1, {}
    state.program = empty_program()
    state.released = {}
end

-- Returns true when the connection should close afterwards.
local function handle_control(c, req, closing)
    local what = req.path:sub(10)
    if what == "program" then
        local ok, body = pcall(cjson.decode, req.body ~= "" and req.body or "{}")
        if not ok or type(body) ~= "table" then
            return json_response(c, 400, { error = "program body must be a JSON object" }, closing)
        end
        local ok2, err = pcall(apply_program, body)
        if not ok2 then return json_response(c, 400, { error = tostring(err) }, closing) end
        return json_response(c, 200, { ok = true }, closing)
    elseif what == "hits" then
        return json_response(c, 200, hits_json(req), closing)
    elseif what == "reset" then
        do_reset()
        return json_response(c, 200, { ok = true }, closing)
    elseif what == "stats" then
        return json_response(c, 200, stats(), closing)
    elseif what == "release" then
        local ok, body = pcall(cjson.decode, req.body ~= "" and req.body or "{}")
        if not ok or type(body) ~= "table" or type(body.name) ~= "string" then
            return json_response(c, 400, { error = 'release body must be {"name": "GATE"}' }, closing)
        end
        state.released[body.name] = true
        return json_response(c, 200, { ok = true }, closing)
    end
    return json_response(c, 404, { error = "unknown control endpoint " .. req.path }, closing)
end

---------------------------------------------------------------------------
-- Per-connection handler
---------------------------------------------------------------------------

local function wants_close(req)
    local conn_hdr = (req.header_map["connection"] or ""):lower()
    if req.version == "HTTP/1.0" then return not conn_hdr:find("keep%-alive"), conn_hdr:find("keep%-alive") ~= nil end
    return conn_hdr:find("close") ~= nil, false
end

-- Sends what the program asked for; returns "keep", "close" (polite) or "gone" (socket already dealt with).
local function answer(c, req, rec, r)
    local req_close, keepalive10 = wants_close(req)
    local closing = req_close or r.close
    if r.hold then
        local until_t = gettime() + 300
        while not state.released[r.hold] and gettime() < until_t do sleep_ms(c, 20) end
    end
    if r.delay_ms then sleep_ms(c, r.delay_ms) end
    if r.hold_file then
        local give_up = gettime() + 60
        for _ = 1, 1e5 do
            local f = io.open(r.hold_file, "rb")
            if f then f:close(); break end
            if gettime() >= give_up then break end
            sleep_ms(c, 10)
        end
    end
    if r.silent then
        -- hold the connection open without answering until the peer gives up
        for _ = 1, 1e9 do
            if not recv_some(c) then break end
        end
        return "close"
    end
    if r.reset == "before_head" then reset_close(c); return "gone" end

    for _, ir in ipairs(r.interim or {}) do
        if not send_all(c, interim_bytes(ir)) then return "close" end
    end
    local head, pieces = build_response(r, req, rec, closing, keepalive10)
    local half
    if r.reset == "mid_body" then
        local total = 0
        for _, p in ipairs(pieces) do total = total + #p end
        if total == 0 then
            half = 0
            head = head:sub(1, math.floor(#head / 2)) -- raw responses have no separate body: cut the bytes
        else
            half = math.floor(total / 2)
        end
    end
    if not send_all(c, head) then return "close" end
    local pause = (r.reset_delay_ms or 50)
    if r.reset == "after_head" then sleep_ms(c, pause); reset_close(c); return "gone" end
    if r.body_delay_ms and #pieces > 0 then sleep_ms(c, r.body_delay_ms) end
    local sent = 0
    for i, p in ipairs(pieces) do
        if half then
            if sent >= half then break end
            if sent + #p > half then p = p:sub(1, half - sent) end
        end
        if i > 1 and r.chunk_delay_ms then sleep_ms(c, r.chunk_delay_ms) end
        if not send_all(c, p) then return "close" end
        sent = sent + #p
    end
    -- the pause lets sent bytes reach the peer: RST discards anything still queued locally
    if half then sleep_ms(c, pause); reset_close(c); return "gone" end
    return closing and "close" or "keep"
end

local function handle_conn(c)
    for _ = 1, 1e9 do
        local ok, req = pcall(read_request, c)
        if not ok then
            if type(req) == "table" and req.bad then
                vlog("conn %d: 400 %s", c.id, req.msg)
                if c.requests == 0 then c.control = false end
                json_response(c, 400, { error = req.msg }, true)
                graceful_close(c)
                return
            end
            error(req, 0)
        end
        if not req then return end
        c.requests = c.requests + 1
        if c.requests == 1 then c.control = req.is_control end

        if req.is_control then
            if not req.complete then return end
            local closing = wants_close(req)
            handle_control(c, req, closing)
            if closing then graceful_close(c); return end
        else
            local rec = record_hit(c, req)
            if not req.complete then return end
            local r = pick_response(req.path)
            local outcome = answer(c, req, rec, r)
            if outcome == "gone" then return end
            if outcome == "close" then graceful_close(c); return end
        end
    end
end

---------------------------------------------------------------------------
-- Event loop
---------------------------------------------------------------------------

local function drop_conn(c)
    if not c.sock_closed then
        c.sock:close()
        c.sock_closed = true
    end
    conns[c] = nil
    by_sock[c.sock] = nil
end

local function resume(c)
    if coroutine.status(c.co) == "dead" then return drop_conn(c) end
    c.want, c.wake_at = nil, nil
    local ok, err = coroutine.resume(c.co)
    if not ok then log("conn %d: coroutine error: %s", c.id, tostring(err)) end
    if not ok or coroutine.status(c.co) == "dead" then drop_conn(c) end
end

local function accept_all(server)
    for _ = 1, 256 do
        local sock = server:accept()
        if not sock then return end
        sock:settimeout(0)
        sock:setoption("tcp-nodelay", true)
        state.next_conn_id = state.next_conn_id + 1
        local c = { id = state.next_conn_id, sock = sock, buf = "", requests = 0 }
        c.co = coroutine.create(function()
            local ok, err = xpcall(handle_conn, debug.traceback, c)
            if not ok then log("conn %d crashed: %s", c.id, tostring(err)) end
        end)
        conns[c], by_sock[sock] = true, c
        touch_conn(c)
        vlog("accepted conn %d", c.id)
        resume(c)
    end
end

local function main(argv)
    parse_args(argv)
    state.program = empty_program()
    if opts.program_file then
        local f = io.open(opts.program_file, "rb")
        if not f then usage("cannot read " .. opts.program_file) end
        local ok, err = pcall(apply_program, cjson.decode(f:read("*a")))
        f:close()
        if not ok then usage(opts.program_file .. ": " .. tostring(err)) end
    end
    local server = assert(socket.tcp())
    server:setoption("reuseaddr", true)
    local ok, err = server:bind(opts.host, opts.port)
    if not ok then log("bind %s:%s failed: %s", opts.host, opts.port, tostring(err)); os.exit(1) end
    assert(server:listen(512))
    server:settimeout(0)
    local host, port = server:getsockname()
    io.stdout:write(("listening %s:%d\n"):format(host, port))
    io.stdout:flush()

    local deadline = gettime() + opts.max_seconds
    for _ = 1, math.huge do
        local now = gettime()
        if now >= deadline then
            vlog("max-seconds reached, exiting")
            os.exit(0)
        end
        local recvt, sendt = { server }, {}
        local timeout = math.min(deadline - now, 1.0)
        for c in pairs(conns) do
            if c.want == "read" then recvt[#recvt + 1] = c.sock
            elseif c.want == "write" then sendt[#sendt + 1] = c.sock end
            if c.wake_at then timeout = math.min(timeout, c.wake_at - now) end
        end
        local r, w = socket.select(recvt, sendt, math.max(timeout, 0))
        local ready = {}
        for _, s in ipairs(r) do
            if s == server then accept_all(server) elseif by_sock[s] then ready[by_sock[s]] = true end
        end
        for _, s in ipairs(w) do
            if by_sock[s] then ready[by_sock[s]] = true end
        end
        now = gettime()
        for c in pairs(conns) do
            if c.wake_at and c.wake_at <= now then ready[c] = true end
        end
        for c in pairs(ready) do
            if conns[c] then resume(c) end
        end
    end
end

main(arg)
