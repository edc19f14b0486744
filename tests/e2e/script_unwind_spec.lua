-- Every stop unwinds (issue 33, item 2): a hook stopped by script_timeout or script_memory_max deep inside the
-- callbacks of gsub, table.sort, string.format and tostring, or inside a lazily required module's main chunk,
-- leaves the sandbox as if the call had returned. Three stops, then ordinary requests on the same route and the
-- same worker: string.format works, a token check refuses a request without its token (the upstream never sees
-- it), the module loads. The real binary, one worker, the fault upstream.
package.path = "tests/e2e/?.lua;" .. package.path
local H = require("helpers")

local ctx = H.context

-- Each attack nests its callbacks 20 deep before the bound stops it: a sandbox that forgets to count them back
-- down is past its 50 after three stops, and every later string.format of the state fails.
local ROUTE = [[
local DEEP = 20
local leaves = {
    spin = function() while true do end end,                       -- stopped by script_timeout
    bomb = function() return ("x"):rep(12 * 1048576) end,          -- refused at once by script_memory_max 8m
}
local nest = {}
function nest.gsub(n, leaf)
    return (("x"):gsub("x", function()
        if n == 0 then leaf() end
        return nest.gsub(n - 1, leaf)
    end))
end
function nest.sort(n, leaf)
    table.sort({ 2, 1 }, function(a, b)
        if n == 0 then leaf() end
        nest.sort(n - 1, leaf)
        return a < b
    end)
end
function nest.format(n, leaf)
    return string.format("%s", setmetatable({}, { __tostring = function()
        if n == 0 then leaf() end
        return nest.format(n - 1, leaf)
    end }))
end
function nest.tostring(n, leaf)
    return tostring(setmetatable({}, { __tostring = function()
        if n == 0 then leaf() end
        return nest.tostring(n - 1, leaf)
    end }))
end
function nest.require(_, leaf)
    lazy_attack = leaf -- lazy.lua's main chunk runs it: a stop mid-load
    return require("lazy")
end

local shown = setmetatable({}, { __tostring = function() return "shown" end })

return { on_request = function(req)
    local attack = req:header("X-Attack")
    if attack then
        return nest[attack](DEEP, leaves[req:header("X-Leaf")])
    end
    lazy_attack = nil
    -- the ordinary way: a token check, a message made with string.format
    if req:header("X-Token") ~= "s3cret" then
        return req:respond(401, { ["Content-Type"] = "text/plain" },
            string.format("%s needs a token\n", req.path))
    end
    local sorted = { "b", "c", "a" }
    table.sort(sorted, function(a, b) return a < b end)
    req:set_header("X-Checked", string.format("%s %s %s %s", require("lazy").tag, tostring(shown),
        table.concat(sorted), (("x"):gsub("x", function() return "y" end))))
end }
]]

local LAZY = [[
if lazy_attack then lazy_attack() end
return { tag = "lazy" }
]]

local CONF = [[
worker_processes 1;
error_log logs/error.log info;
http {
    {{BOUNDS}}
    upstream up { server {{UPSTREAM}}; retry_budget off; }
    server {
        listen 127.0.0.1:{{PORT}};
        location / { script {{SCRIPT}}; proxy_pass http://up; }
    }
}
]]

local rss_kb = H.rss_kib

local sanitized = H.sanitized

local function count(text, plain)
    local n, from = 0, 1
    while true do
        local at = text:find(plain, from, true)
        if not at then return n end
        n, from = n + 1, at + #plain
    end
end

-- The bounds: each case sets one far from the other, so only the one it means can stop the attack.
local BOUNDS = {
    { leaf = "spin", name = "script_timeout", conf = "script_timeout 50ms; script_memory_max 64m;",
      logged = "stopped: it ran longer than a hook may" },
    { leaf = "bomb", name = "script_memory_max", conf = "script_timeout 10s; script_memory_max 8m;",
      logged = "stopped: it used more memory than script_memory_max allows" },
}

local WHERE = {
    { "gsub", "a gsub callback" },
    { "sort", "a table.sort comparator" },
    { "format", "string.format's __tostring" },
    { "tostring", "tostring's __tostring" },
    { "require", "a lazily required module's main chunk" },
}

for _, bound in ipairs(BOUNDS) do
    describe("a hook stopped by " .. bound.name, function()
        for _, where in ipairs(WHERE) do
            it("inside " .. where[2] .. " leaves the sandbox as it was for the next requests", function()
                local up = H.start_upstream()
                local dir = H.mkdtemp("unwind")
                H.write_file(dir .. "/route.lua", ROUTE)
                H.write_file(dir .. "/lazy.lua", LAZY)
                local gw = H.start_gateway({ conf = CONF, upstream = up,
                    vars = { SCRIPT = dir .. "/route.lua", BOUNDS = bound.conf } })
                local ok, err = pcall(function()
                    local worker = H.wait_until(function() return gw:workers()[1] end, 5)
                    assert.truthy(worker, ctx(gw, "no worker"))
                    local rss_before = assert(rss_kb(worker))
                    for i = 1, 3 do
                        local r = H.request(gw.port, { method = "GET", path = "/attack", timeout = 20,
                            headers = { ["X-Attack"] = where[1], ["X-Leaf"] = bound.leaf } })
                        assert.truthy(r, ctx(gw, "no answer to attack " .. i))
                        assert.equal(200, r.status, ctx(gw, "attack " .. i))
                    end
                    -- stopped three times by the bound meant, and the state was not made again (which would
                    -- clear any bookkeeping anyway)
                    assert.equal(3, count(gw:log(), bound.logged), ctx(gw))
                    assert.is_nil(gw:log():find("was made again", 1, true), ctx(gw))

                    up:reset()
                    local r = assert(H.request(gw.port, { method = "GET", path = "/account" }))
                    assert.equal(401, r.status, ctx(gw, "no token"))
                    assert.equal("/account needs a token\n", r.body)
                    assert.equal(0, up:stats().hits, ctx(gw, "a request without the token reached the upstream"))

                    r = assert(H.request(gw.port, { method = "GET", path = "/account",
                        headers = { ["X-Token"] = "s3cret" } }))
                    assert.equal(200, r.status, ctx(gw))
                    local hits = up:hits()
                    assert.equal(1, #hits, ctx(gw))
                    assert.same({ "lazy shown abc y" }, H.hit_values(hits[1], "X-Checked"), ctx(gw))
                    assert.same({ worker }, gw:workers(), ctx(gw, "the worker changed"))
                    assert.equal(3, count(gw:log(), "on_request failed"), ctx(gw))
                    if not sanitized() then
                        local after = assert(rss_kb(worker))
                        assert.truthy(after - rss_before < 10 * 1024,
                            ("worker RSS %d KiB before, %d KiB after"):format(rss_before, after))
                    end
                end)
                gw:stop()
                up:stop()
                H.rm_rf(dir)
                assert(ok, err)
            end)
        end
    end)
end
