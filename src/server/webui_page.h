/*
 * webui_page.h - the chat page served at GET /, as bytes compiled into the server.
 *
 * The definitions are generated at build time (scripts/bundle-webui.mjs, from web/ and the
 * npm libraries, into the build folder's webui_page.c); a build configured with
 * -DGPTOSS_WEBUI=OFF defines an empty page. Read by webui.c only.
 */
#ifndef GPTOSS_SERVER_WEBUI_PAGE_H
#define GPTOSS_SERVER_WEBUI_PAGE_H

#include <stddef.h>

extern const unsigned char gptoss_webui_html[]; /* [gptoss_webui_html_len] UTF-8 HTML */
extern const size_t gptoss_webui_html_len;      /* 0: built without the page */
extern const char gptoss_webui_csp[];           /* Content-Security-Policy for the page */
extern const char gptoss_webui_etag[];          /* quoted hash of the page */

#endif
