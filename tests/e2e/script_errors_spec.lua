-- What a route script's errors and ricochet.log put in the error log (issue 33, item 7): one line per event,
-- whatever newlines a script or a client's data carry (escaped, \n as text); every failure with the FILE:LINE
-- that raised it and a traceback, error({}) and error(nil) too; a long message cut, not its traceback; the
-- sandbox's nesting bound named. The real binary, one worker, the fault upstream.
package.path = "tests/e2e/?.lua;" .. package.path
local H = require("helpers")

local ctx = H.context

-- line numbers matter: the specs name them
local ROUTE = [[
local function deep() return (("x"):gsub("x", deep)) end
return { on_request = function(req)
    local p = req.path
    if p == "/forge" then ricochet.log("error", "a\nfake [error] line\r\tend\1\\") end
    if p == "/client" then ricochet.log("warn", "note:", req:json().note) end
    if p == "/table" then error({ code = 7 }) end
    if p == "/nil" then error(nil) end
    if p == "/long" then error(("x"):rep(6000) .. " the end of a long message") end
    if p == "/deep" then deep() end
    if p == "/api" then req:set_header("X\nfake", "v") end
    if p == "/callback" then local _ = ("x"):gsub("x", function() error({}) end) end
    req:set_header("X-Ran", "yes")
end }
]]

local CONF = [[
worker_processes 1;
error_log logs/error.log info;
http {
    upstream up { server {{UPSTREAM}}; retry_budget off; }
    server {
        listen 127.0.0.1:{{PORT}};
        location / { script {{SCRIPT}}; proxy_pass http://up; }
    }
}
]]

local function error_log_lines(gw)
    local f = assert(io.open(gw.prefix .. "/logs/error.log", "r"))
    local text = f:read("*a")
    f:close()
    local lines = {}
    for line in text:gmatch("[^\n]*") do
        if line ~= "" then lines[#lines + 1] = line end
    end
    return lines
end

-- the error log's lines that contain plain
local function lines_with(gw, plain)
    local out = {}
    for _, line in ipairs(error_log_lines(gw)) do
        if line:find(plain, 1, true) then out[#out + 1] = line end
    end
    return out
end

-- every line of the error log is one the gateway began: a time, a level, a pid
local function all_lines_are_the_gateways(gw)
    for _, line in ipairs(error_log_lines(gw)) do
        assert.truthy(line:match("^%d%d%d%d/%d%d/%d%d %d%d:%d%d:%d%d %[%a+%] %d+: "), ctx(gw, line))
    end
end

describe("a route script's errors in the error log", function()
    local up, gw, dir

    setup(function()
        up = H.start_upstream()
        dir = H.mkdtemp("errors")
        H.write_file(dir .. "/route.lua", ROUTE)
        gw = H.start_gateway({ conf = CONF, upstream = up, vars = { SCRIPT = dir .. "/route.lua" } })
    end)

    teardown(function()
        if gw then gw:stop() end
        if up then up:stop() end
        H.rm_rf(dir)
    end)

    local function get(path, body)
        local r = assert(H.request(gw.port, { method = body and "POST" or "GET", path = path, body = body,
            headers = body and { ["Content-Type"] = "application/json" } or nil }))
        assert.equal(200, r.status, ctx(gw, path))
        return r
    end

    it("cannot be made to forge a line by ricochet.log: control bytes go escaped", function()
        get("/forge")
        local lines = lines_with(gw, "fake [error] line")
        assert.equal(1, #lines, ctx(gw))
        assert.truthy(lines[1]:find("[error]", 1, true), ctx(gw))
        assert.truthy(lines[1]:find("route.lua:4: a\\nfake [error] line\\r\\tend\\x01\\x5c", 1, true),
            ctx(gw))
        all_lines_are_the_gateways(gw)
    end)

    it("cannot be made to forge a line by a client's data a script logs", function()
        get("/client", '{"note":"x\\n2020/01/01 00:00:00 [emerg] 1: forged"}')
        local lines = lines_with(gw, "forged")
        assert.equal(1, #lines, ctx(gw))
        assert.truthy(lines[1]:find("note: x\\n2020/01/01 00:00:00 [emerg] 1: forged", 1, true), ctx(gw))
        all_lines_are_the_gateways(gw)
    end)

    it("keeps an API error's text (a script's field name) on one line", function()
        get("/api")
        local lines = lines_with(gw, "is not a valid field name")
        assert.equal(1, #lines, ctx(gw))
        assert.truthy(lines[1]:find('route.lua:10: req:set_header: "X\\nfake" is not a valid field name', 1, true),
            ctx(gw))
        assert.truthy(lines[1]:find("\\nstack traceback:\\n\\t", 1, true), ctx(gw))
        all_lines_are_the_gateways(gw)
    end)

    for _, case in ipairs({ { "/table", "table", 6 }, { "/nil", "nil", 7 } }) do
        it("logs error(" .. case[2] .. "-value) with FILE:LINE and a traceback", function()
            get(case[1])
            local what = ("(error object is a %s value)"):format(case[2])
            local lines = lines_with(gw, what)
            assert.equal(1, #lines, ctx(gw))
            assert.truthy(lines[1]:find("on_request failed (the built-in policy decides): ", 1, true), ctx(gw))
            assert.truthy(lines[1]:find(("route.lua:%d: %s\\nstack traceback:\\n\\t"):format(case[3], what), 1,
                true), ctx(gw))
            assert.truthy(lines[1]:find("route.lua:" .. case[3] .. ": in function", 1, true), ctx(gw))
        end)
    end

    it("names the script's line of an error object raised in a callback, not the sandbox's", function()
        get("/callback")
        local lines = lines_with(gw, "(error object is a table value)")
        local last = lines[#lines]
        assert.truthy(last and last:find("route.lua:11: (error object is a table value)\\nstack traceback:", 1,
            true), ctx(gw))
    end)

    it("cuts a long message, not its traceback", function()
        get("/long")
        local lines = lines_with(gw, "xxxxxxxxxx")
        assert.equal(1, #lines, ctx(gw))
        local line = lines[1]
        assert.is_nil(line:find("the end of a long message", 1, true), ctx(gw))
        assert.truthy(line:find("route.lua:8: xxxxxxxxxx", 1, true), ctx(gw))
        assert.truthy(line:find("xxx...\\nstack traceback:\\n\\t", 1, true), ctx(gw))
        assert.truthy(line:find("route.lua:8: in function", 1, true), ctx(gw))
        assert.truthy(line:find(", client: 127.0.0.1:%d+$"), ctx(gw))
    end)

    it("says callbacks nested more than 50 deep", function()
        get("/deep")
        local lines = lines_with(gw, "string.gsub: callbacks nested more than 50 deep")
        assert.equal(1, #lines, ctx(gw))
        assert.truthy(lines[1]:find("on_request failed", 1, true), ctx(gw))
        -- and the state is as before: the script runs on
        up:reset()
        get("/fine")
        assert.same({ "yes" }, H.hit_values(up:hits()[1], "X-Ran"), ctx(gw))
    end)
end)
