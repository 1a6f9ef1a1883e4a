/*
 * webui.c - GET /: the chat page (web/), a single HTML file compiled into the server
 * (webui_page.h). The page itself needs no API key (it holds no data; its API calls carry
 * the key the user types in). Off with --no-webui or in a -DGPTOSS_WEBUI=OFF build: 404.
 *
 * Owns: the page's response headers (type, caching by ETag, a Content-Security-Policy that lets
 * the page reach only this server). Must not touch the engine.
 */
#include "server/server_internal.h"
#include "server/webui_page.h"

#include <string.h>

server_reply server_webui(gptoss_server *s, const server_request *request) {
    if (!s->webui || gptoss_webui_html_len == 0)
        return server_error(404, "invalid_request_error", NULL, "not_found",
                            "The web page is off (%s); the API is at /v1/chat/completions, "
                            "/v1/completions and /v1/models",
                            s->webui ? "this build has none: -DGPTOSS_WEBUI=OFF" : "--no-webui");
    server_reply reply = {200, NULL};
    /* The browser revalidates each time (no-cache) and gets a 304 while the binary is the same. */
    const char *etag_seen =
        MHD_lookup_connection_value(request->connection, MHD_HEADER_KIND, "If-None-Match");
    if (etag_seen && strstr(etag_seen, gptoss_webui_etag)) {
        reply.status = 304;
        reply.response = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    } else {
        reply.response = MHD_create_response_from_buffer(
            gptoss_webui_html_len, (void *)gptoss_webui_html, MHD_RESPMEM_PERSISTENT);
    }
    if (!reply.response) return reply;
    MHD_add_response_header(reply.response, "Content-Type", "text/html; charset=utf-8");
    MHD_add_response_header(reply.response, "Cache-Control", "no-cache");
    MHD_add_response_header(reply.response, "ETag", gptoss_webui_etag);
    MHD_add_response_header(reply.response, "Content-Security-Policy", gptoss_webui_csp);
    MHD_add_response_header(reply.response, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(reply.response, "Referrer-Policy", "no-referrer");
    return reply;
}
