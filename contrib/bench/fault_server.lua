-- fault_server.lua: a fast fault-injecting HTTP/1.1 upstream for contrib/bench/faults.sh.
--
-- usage: luajit contrib/bench/fault_server.lua [--port N] [--seed N]
-- Listens on 127.0.0.1 (port 0: a free one) and prints "listening 127.0.0.1:PORT" once ready.
-- One thread, epoll through the LuaJIT FFI, keep-alive, minimal parsing: it answers many
-- times faster than a luasocket select() loop (tests/tools/fault_upstream.lua), so that the
-- proxies, not the upstream, set the pace.
--
-- Every request is a hit, answered "200 OK" ("ok\n") or "503 Service Unavailable" (no
-- Retry-After), on a connection kept open either way. A hit fails with probability P when it
-- arrives between FROM and TO seconds after the last arming:
--   GET /__fault/arm?p=P&from=FROM&to=TO   zero the counters, restart the clock, set the
--                                          fault (defaults p=0 from=0 to=forever); answers the stats
--   GET /__fault/stats                     "hits=N ok=N failed=N conns=N elapsed=SECONDS\n"
--                                          (conns: connections accepted since arming)
-- Control requests are not hits. 30% random 503s: p=0.3; a brownout from 1.25 s to 2.75 s:
-- p=1&from=1.25&to=2.75; an outage: p=1.
-- Slow answers: with slow=S&slow_ms=MS&fast_ms=F (arming parameters, defaults 0, 1000, 0) a 200
-- is sent after MS milliseconds with probability S, else after F; an answer waiting when its
-- connection closes is never sent (and counted as dropped=N in the stats). 5% of answers taking
-- 1 s, the rest 5 ms: slow=0.05&slow_ms=1000&fast_ms=5. Answers on one connection keep their order.
-- Split answers: with split=1 (an arming parameter) every answer sent at once goes in two writes,
-- its head and then its body, with TCP_NODELAY off on the connection: Nagle holds the body until
-- the head is acknowledged, as Python's http.server and many application servers send. The
-- proxy's delayed ACK then shows in every answer.
local ffi = require("ffi")
local bit = require("bit")
local C = ffi.C

ffi.cdef [[
typedef struct { uint16_t family; uint16_t port; uint32_t addr; uint8_t zero[8]; } fs_sockaddr_in;
typedef struct { long tv_sec; long tv_nsec; } fs_timespec;
int socket(int domain, int type, int protocol);
int setsockopt(int fd, int level, int name, const void *val, unsigned len);
int bind(int fd, const void *addr, unsigned len);
int listen(int fd, int backlog);
int getsockname(int fd, void *addr, unsigned *len);
int accept4(int fd, void *addr, void *len, int flags);
long read(int fd, void *buf, size_t n);
long send(int fd, const void *buf, size_t n, int flags);
int close(int fd);
int epoll_create1(int flags);
int epoll_ctl(int epfd, int op, int fd, void *event);
int epoll_wait(int epfd, void *events, int max, int timeout);
int clock_gettime(int clock, fs_timespec *ts);
char *strerror(int errnum);
]]
-- struct epoll_event is packed on x86-64 only
if ffi.arch == "x64" then
    ffi.cdef("typedef struct __attribute__((packed)) { uint32_t events; uint64_t data; } fs_epoll_event;")
else
    ffi.cdef("typedef struct { uint32_t events; uint64_t data; } fs_epoll_event;")
end

local AF_INET, SOCK_STREAM, SOCK_NONBLOCK, SOCK_CLOEXEC = 2, 1, 0x800, 0x80000
local SOL_SOCKET, SO_REUSEADDR, IPPROTO_TCP, TCP_NODELAY = 1, 2, 6, 1
local EPOLLIN, EPOLLOUT = 0x1, 0x4
local EPOLL_CTL_ADD, EPOLL_CTL_DEL, EPOLL_CTL_MOD = 1, 2, 3
local EAGAIN, EINTR = 11, 4
local MSG_NOSIGNAL = 0x4000 -- a write to a connection the proxy closed is an error, not SIGPIPE
local CLOCK_MONOTONIC = 1
local MAX_HEAD = 16384

local port, seed = 0, 1
do
    local i = 1
    while i <= #arg do
        if arg[i] == "--port" then port = tonumber(arg[i + 1]); i = i + 2
        elseif arg[i] == "--seed" then seed = tonumber(arg[i + 1]); i = i + 2
        else io.stderr:write("usage: luajit fault_server.lua [--port N] [--seed N]\n"); os.exit(2) end
    end
    if not port or not seed then io.stderr:write("fault_server: bad argument\n"); os.exit(2) end
end

local function fail(what)
    io.stderr:write("fault_server: ", what, ": ", ffi.string(C.strerror(ffi.errno())), "\n")
    os.exit(1)
end

local ts = ffi.new("fs_timespec")
local function now()
    C.clock_gettime(CLOCK_MONOTONIC, ts)
    return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

local function head_of(status, reason, body)
    return ("HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n")
        :format(status, reason, #body)
end
local function response(status, reason, body)
    return head_of(status, reason, body) .. body
end
local OK = response(200, "OK", "ok\n")
local UNAVAILABLE = response(503, "Service Unavailable", "unavailable\n")
-- split=1: each answer's head, then its body
local HEAD_OF = { [OK] = head_of(200, "OK", "ok\n"),
    [UNAVAILABLE] = head_of(503, "Service Unavailable", "unavailable\n") }
local BAD = response(400, "Bad Request", "bad request\n")

-- the fault and the counters
local p, from, to, armed = 0, 0, math.huge, now()
local split = false
local slow, slow_s, fast_s = 0, 1, 0
local hits, oks, fails, accepted, dropped = 0, 0, 0, 0, 0
math.randomseed(seed)
local random = math.random

local function stats()
    return ("hits=%d ok=%d failed=%d conns=%d elapsed=%.3f dropped=%d\n"):format(hits, oks, fails, accepted,
        now() - armed, dropped)
end

local function control(target)
    local path, query = target:match("^([^?]*)%??(.*)$")
    if path == "/__fault/arm" then
        local np, nfrom, nto, nslow, nslow_ms, nfast_ms, nsplit = 0, 0, math.huge, 0, 1000, 0, 0
        for k, v in query:gmatch("([^&=]+)=([^&]*)") do
            local n = tonumber(v)
            if not n then return response(400, "Bad Request", "bad value for " .. k .. "\n") end
            if k == "p" then np = n elseif k == "from" then nfrom = n elseif k == "to" then nto = n
            elseif k == "slow" then nslow = n elseif k == "slow_ms" then nslow_ms = n
            elseif k == "fast_ms" then nfast_ms = n
            elseif k == "split" then nsplit = n
            else return response(400, "Bad Request", "unknown parameter " .. k .. "\n") end
        end
        p, from, to = np, nfrom, nto
        slow, slow_s, fast_s = nslow, nslow_ms / 1000, nfast_ms / 1000
        split = nsplit ~= 0
        hits, oks, fails, accepted, dropped = 0, 0, 0, 0, 0
        armed = now()
        return response(200, "OK", stats())
    elseif path == "/__fault/stats" then
        return response(200, "OK", stats())
    end
    return response(404, "Not Found", "unknown control path\n")
end

local function answer()
    hits = hits + 1
    if p > 0 then
        local t = now() - armed
        if t >= from and t < to and (p >= 1 or random() < p) then
            fails = fails + 1
            return UNAVAILABLE
        end
    end
    oks = oks + 1
    if slow > 0 and random() < slow then return OK, slow_s end
    return OK, fast_s
end

-- listening socket
local lfd = C.socket(AF_INET, bit.bor(SOCK_STREAM, SOCK_NONBLOCK, SOCK_CLOEXEC), 0)
if lfd < 0 then fail("socket") end
local one = ffi.new("int[1]", 1)
C.setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, one, 4)
local sa = ffi.new("fs_sockaddr_in")
sa.family = AF_INET
sa.port = bit.rshift(bit.bswap(port), 16)
sa.addr = bit.bswap(0x7f000001)
if C.bind(lfd, sa, ffi.sizeof(sa)) ~= 0 then fail("bind 127.0.0.1:" .. port) end
if C.listen(lfd, 4096) ~= 0 then fail("listen") end
local salen = ffi.new("unsigned[1]", ffi.sizeof(sa))
C.getsockname(lfd, sa, salen)
local bound = bit.rshift(bit.bswap(sa.port), 16)

local ep = C.epoll_create1(0)
if ep < 0 then fail("epoll_create1") end
local ev = ffi.new("fs_epoll_event")
local function ctl(op, fd, events)
    ev.events = events
    ev.data = fd
    return C.epoll_ctl(ep, op, fd, ev)
end
ctl(EPOLL_CTL_ADD, lfd, EPOLLIN)

local conns = {} -- fd -> { buf = unread bytes, out = unsent bytes or nil, closing = bool }

-- Connections with answers waiting to be sent (slow=, fast_ms=): fd -> true. Each one's c.later is
-- a queue of { due = time, data = bytes }, sent in order.
local waiting = {}

local function drop(fd)
    local c = conns[fd]
    if c and c.later then dropped = dropped + #c.later end
    waiting[fd] = nil
    ctl(EPOLL_CTL_DEL, fd, 0)
    C.close(fd)
    conns[fd] = nil
end

-- Sends what is queued; false when the connection is gone.
local function flush(fd, c)
    local out = c.out
    while #out > 0 do
        local n = C.send(fd, out, #out, MSG_NOSIGNAL)
        if n < 0 then
            local e = ffi.errno()
            if e == EAGAIN then
                if not c.waiting then ctl(EPOLL_CTL_MOD, fd, EPOLLOUT); c.waiting = true end
                c.out = out
                return true
            elseif e ~= EINTR then
                return false
            end
        else
            out = out:sub(tonumber(n) + 1)
        end
    end
    c.out = ""
    if c.waiting then ctl(EPOLL_CTL_MOD, fd, EPOLLIN); c.waiting = false end
    return not c.closing
end

-- Answers every whole request in c.buf (pipelining allowed); an answer with a delay, and every one
-- after it on the connection, goes to c.later.
local function serve(c)
    local buf, replies = c.buf, {}
    while true do
        local e = buf:find("\r\n\r\n", 1, true)
        if not e then
            if #buf > MAX_HEAD then replies[#replies + 1] = BAD; c.closing = true; buf = "" end
            break
        end
        local head = buf:sub(1, e + 3)
        local target = head:match("^%u+ (%S+) HTTP/1%.%d\r\n")
        local skip = e + 3
        -- a body, if any, is skipped; chunked request bodies are not supported
        local low = head:find("[Ll]ength:") and head:lower() or nil
        local cl = low and tonumber(low:match("\r\ncontent%-length:%s*(%d+)"))
        if not target or (head:find("[Ee]ncoding:") and head:lower():find("\r\ntransfer%-encoding:")) then
            replies[#replies + 1] = BAD; c.closing = true; buf = ""
            break
        end
        if cl then
            if #buf < skip + cl then break end
            skip = skip + cl
        end
        buf = buf:sub(skip + 1)
        if target:sub(1, 9) == "/__fault/" then
            replies[#replies + 1] = control(target)
        else
            local reply, delay = answer()
            if (delay and delay > 0) or c.later then
                c.later = c.later or {}
                c.later[#c.later + 1] = { due = now() + (delay or 0), data = table.concat(replies) .. reply }
                replies = {}
                waiting[c.fd] = true
            elseif split then
                -- two writes: the head, then the body (the loop below writes each piece alone)
                local h = HEAD_OF[reply]
                replies[#replies + 1] = h
                replies[#replies + 1] = reply:sub(#h + 1)
                c.pieces = true
            else
                replies[#replies + 1] = reply
            end
        end
        if head:find("[Cc]lose\r\n") and head:lower():find("\r\nconnection:[^\r]*close") then
            c.closing = true; buf = ""
            break
        end
    end
    c.buf = buf
    if c.pieces then
        c.pieces = nil
        return replies
    end
    if #replies == 0 then return "" end
    return #replies == 1 and replies[1] or table.concat(replies)
end

-- TCP_NODELAY as split wants it on c: off while answers are split (Nagle's hold is the point)
local function nodelay(c)
    if c.nagle ~= split then
        c.nagle = split
        local v = ffi.new("int[1]", split and 0 or 1)
        C.setsockopt(c.fd, IPPROTO_TCP, TCP_NODELAY, v, 4)
    end
end

local rbuf_size = 65536
local rbuf = ffi.new("uint8_t[?]", rbuf_size)
local MAX_EVENTS = 256
local events = ffi.new("fs_epoll_event[?]", MAX_EVENTS)

io.stdout:write("listening 127.0.0.1:", bound, "\n")
io.stdout:flush()

-- Sends the waiting answers that are due; returns the ms until the next one (-1: none waits).
local function release()
    local t, next_due = now(), nil
    for fd in pairs(waiting) do
        local c = conns[fd]
        local q = c and c.later
        while q and #q > 0 and q[1].due <= t do
            c.out = c.out .. table.remove(q, 1).data
        end
        if c and #c.out > 0 and not c.waiting and not flush(fd, c) and #q == 0 then
            drop(fd) -- a write failed, or the last answer before a close went
        elseif q and #q == 0 then
            c.later = nil
            waiting[fd] = nil
        elseif q then
            next_due = next_due and math.min(next_due, q[1].due) or q[1].due
        end
    end
    if not next_due then return -1 end
    return math.max(0, math.ceil((next_due - t) * 1000))
end

while true do
    local n = C.epoll_wait(ep, events, MAX_EVENTS, next(waiting) and release() or -1)
    if n < 0 and ffi.errno() ~= EINTR then fail("epoll_wait") end
    for i = 0, n - 1 do
        local fd = tonumber(events[i].data)
        local what = events[i].events
        if fd == lfd then
            while true do
                local cfd = C.accept4(lfd, nil, nil, bit.bor(SOCK_NONBLOCK, SOCK_CLOEXEC))
                if cfd < 0 then break end
                accepted = accepted + 1
                C.setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, one, 4)
                conns[cfd] = { fd = cfd, buf = "", out = "", closing = false, waiting = false, nagle = false }
                ctl(EPOLL_CTL_ADD, cfd, EPOLLIN)
            end
        else
            local c = conns[fd]
            if c then
                if bit.band(what, EPOLLOUT) ~= 0 then
                    if not flush(fd, c) then drop(fd); c = nil end
                end
                if c and bit.band(what, bit.bnot(EPOLLOUT)) ~= 0 and not c.waiting then
                    local got = C.read(fd, rbuf, rbuf_size)
                    if got > 0 then
                        c.buf = c.buf .. ffi.string(rbuf, got)
                        nodelay(c)
                        local out = serve(c)
                        if type(out) == "table" then
                            local ok = true
                            for _, piece in ipairs(out) do -- each piece its own write
                                c.out = c.out .. piece
                                ok = flush(fd, c)
                            end
                            if not ok and not c.later then drop(fd) end
                        else
                            c.out = c.out .. out
                            if not flush(fd, c) and not c.later then drop(fd) end
                        end
                    elseif got == 0 or (ffi.errno() ~= EAGAIN and ffi.errno() ~= EINTR) then
                        drop(fd)
                    end
                end
            end
        end
    end
end
