-- search.lua: POST /search only reads (a query too large for a URL), so it may be repeated like a GET.
-- Every other POST stays unsafe: only an idempotency key would make it retryable.
local route = {}

function route.on_request(req)
    if req.method == "POST" and (req.path == "/search" or req.path:match("^/search/")) then
        req.idempotent = true
    end
end

return route
