-- overloaded.lua: an API that says it is overloaded in the body of a 200, {"error":"overloaded"}. Such a
-- response is retried; any other 200 is final. It reads the body, so its location needs
-- `classify_body_max 1k;` (larger bodies are classified by their head: final).
local route = {}

function route.classify(res, attempt)
    if res == nil or res.status ~= 200 then return nil end
    local body = res:json()
    if type(body) == "table" and body.error == "overloaded" then return "retry" end
    return nil
end

return route
