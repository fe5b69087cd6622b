// agent-gateway: the retirement board's one script (allowed by its hash). The page is complete
// without it; it only reloads the page, so the figures stay current on a wall screen.
document.documentElement.setAttribute("data-refresh-seconds", "30");
setTimeout(function () { location.reload(); }, 30000);
