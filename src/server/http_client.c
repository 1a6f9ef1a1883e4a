/*
 * http_client.c - minimal blocking HTTP/1.1 client (see http_client.h).
 *
 * Owns: the socket of one request and its read buffer. The response is parsed as a small
 * state machine: status line and headers (bounded to 64 KiB), then the body as either
 * chunked, Content-Length, or read-until-close. Must not allocate per body byte.
 */
#include "server/http_client.h"

#include "util/error.h"

#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#define HEADER_LIMIT (64 * 1024)

gptoss_status gptoss_http_url_parse(const char *url, gptoss_http_url *out, gptoss_error *error) {
    memset(out, 0, sizeof *out);
    const char *p = url;
    if (strncmp(p, "http://", 7) != 0)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "URL '%s': only http://host[:port][/path] is supported", url);
    p += 7;
    const char *host_end;
    const char *host = p;
    if (*p == '[') {
        host = p + 1;
        host_end = strchr(host, ']');
        if (!host_end)
            return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT, "URL '%s': unclosed '['",
                                    url);
        p = host_end + 1;
    } else {
        host_end = p + strcspn(p, ":/");
        p = host_end;
    }
    size_t host_len = (size_t)(host_end - host);
    if (host_len == 0 || host_len >= sizeof out->host)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "URL '%s': missing or too long host", url);
    memcpy(out->host, host, host_len);
    snprintf(out->port, sizeof out->port, "80");
    if (*p == ':') {
        p++;
        size_t n = strspn(p, "0123456789");
        if (n == 0 || n > 5 || atoi(p) > 65535)
            return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT, "URL '%s': bad port", url);
        snprintf(out->port, sizeof out->port, "%.*s", (int)n, p);
        p += n;
    }
    if (*p && *p != '/')
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT, "URL '%s': unexpected '%c'",
                                url, *p);
    size_t path_len = strlen(p);
    while (path_len > 0 && p[path_len - 1] == '/')
        path_len--;
    if (path_len >= sizeof out->path_prefix)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT, "URL '%s': path too long", url);
    memcpy(out->path_prefix, p, path_len);
    return GPTOSS_OK;
}

static int connect_to(const gptoss_http_url *url, int timeout_ms, gptoss_error *error) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *addrs = NULL;
    int rc = getaddrinfo(url->host, url->port, &hints, &addrs);
    if (rc != 0) {
        gptoss_set_error(error, GPTOSS_ERR_IO, "%s:%s: %s", url->host, url->port, gai_strerror(rc));
        return -1;
    }
    int fd = -1, last_errno = 0;
    for (struct addrinfo *a = addrs; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
            last_errno = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(addrs);
    if (fd < 0)
        gptoss_set_error(error, GPTOSS_ERR_IO, "cannot connect to %s:%s: %s", url->host, url->port,
                         strerror(last_errno));
    return fd;
}

static bool send_all(int fd, const char *data, size_t len) {
    while (len > 0) {
        ssize_t n = send(fd, data, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        data += n, len -= (size_t)n;
    }
    return true;
}

/* Buffered reader over the socket. */
typedef struct reader {
    int fd;
    char buf[16384]; /* bytes read but not consumed: [start, end) */
    size_t start, end;
    bool eof;
} reader;

static bool fill(reader *r) {
    if (r->start > 0) {
        memmove(r->buf, r->buf + r->start, r->end - r->start);
        r->end -= r->start, r->start = 0;
    }
    if (r->end == sizeof r->buf) return true;
    for (;;) {
        ssize_t n = recv(r->fd, r->buf + r->end, sizeof r->buf - r->end, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return false;
        if (n == 0) r->eof = true;
        r->end += (size_t)n;
        return true;
    }
}

/* One CRLF-terminated line (without the CRLF) into out; false on EOF/timeout/overlong. */
static bool read_line(reader *r, char *out, size_t cap) {
    for (;;) {
        char *nl = memchr(r->buf + r->start, '\n', r->end - r->start);
        if (nl) {
            size_t len = (size_t)(nl - (r->buf + r->start));
            size_t copy = len > 0 && r->buf[r->start + len - 1] == '\r' ? len - 1 : len;
            if (copy >= cap) return false;
            memcpy(out, r->buf + r->start, copy);
            out[copy] = '\0';
            r->start += len + 1;
            return true;
        }
        if (r->end - r->start == sizeof r->buf || r->eof) return false;
        if (!fill(r)) return false;
    }
}

/* Delivers up to `want` body bytes (SIZE_MAX: until EOF). Returns -1 on error, 1 when the
 * callback asked to stop, 0 otherwise. */
static int pass_body(reader *r, size_t want, gptoss_http_body_fn on_body, void *user) {
    while (want > 0) {
        if (r->start == r->end) {
            if (r->eof) return want == SIZE_MAX ? 0 : -1;
            if (!fill(r)) return -1;
            if (r->start == r->end) {
                if (r->eof) return want == SIZE_MAX ? 0 : -1;
                continue;
            }
        }
        size_t n = r->end - r->start;
        if (n > want) n = want;
        if (on_body && on_body(user, r->buf + r->start, n)) return 1;
        r->start += n;
        if (want != SIZE_MAX) want -= n;
    }
    return 0;
}

gptoss_status gptoss_http_request(const gptoss_http_url *url, const char *method, const char *path,
                                  const char *api_key, const char *body, size_t body_len,
                                  int timeout_ms, int *status, gptoss_http_body_fn on_body,
                                  void *user, gptoss_error *error) {
    *status = 0;
    int fd = connect_to(url, timeout_ms, error);
    if (fd < 0) return GPTOSS_ERR_IO;
    char head[2048];
    int n = snprintf(
        head, sizeof head,
        "%s %s%s HTTP/1.1\r\nHost: %s:%s\r\nUser-Agent: gptoss-bench-serve\r\nAccept: */*\r\n"
        "Connection: close\r\n%s%s%s",
        method, url->path_prefix, path, url->host, url->port,
        api_key ? "Authorization: Bearer " : "", api_key ? api_key : "", api_key ? "\r\n" : "");
    if (body)
        n += snprintf(head + n, sizeof head - (size_t)n,
                      "Content-Type: application/json\r\nContent-Length: %zu\r\n", body_len);
    n += snprintf(head + n, sizeof head - (size_t)n, "\r\n");
    reader *r = NULL;
    gptoss_status st = GPTOSS_OK;
    if (n >= (int)sizeof head) {
        st = gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT, "request header too long");
        goto done;
    }
    if (!send_all(fd, head, (size_t)n) || (body && !send_all(fd, body, body_len))) {
        st = gptoss_set_error(error, GPTOSS_ERR_IO, "sending the request to %s:%s failed: %s",
                              url->host, url->port, strerror(errno));
        goto done;
    }
    r = calloc(1, sizeof *r);
    if (!r) {
        st = gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    r->fd = fd;
    char line[4096];
    if (!read_line(r, line, sizeof line) || strncmp(line, "HTTP/1.", 7) != 0 || strlen(line) < 12) {
        st = gptoss_set_error(error, GPTOSS_ERR_IO,
                              "%s:%s: no HTTP response (timeout or closed connection)", url->host,
                              url->port);
        goto done;
    }
    *status = atoi(line + 9);
    bool chunked = false;
    size_t content_length = SIZE_MAX, header_bytes = 0;
    for (;;) {
        if (!read_line(r, line, sizeof line)) {
            st = gptoss_set_error(error, GPTOSS_ERR_IO, "%s:%s: truncated response headers",
                                  url->host, url->port);
            goto done;
        }
        header_bytes += strlen(line) + 2;
        if (header_bytes > HEADER_LIMIT) {
            st = gptoss_set_error(error, GPTOSS_ERR_IO, "response headers exceed %d bytes",
                                  HEADER_LIMIT);
            goto done;
        }
        if (line[0] == '\0') break;
        if (!strncasecmp(line, "Transfer-Encoding:", 18) && strcasestr(line + 18, "chunked"))
            chunked = true;
        if (!strncasecmp(line, "Content-Length:", 15))
            content_length = (size_t)strtoull(line + 15, NULL, 10);
    }
    if (!strcmp(method, "HEAD") || *status == 204 || *status == 304) goto done;
    if (!chunked) {
        if (pass_body(r, content_length, on_body, user) < 0)
            st = gptoss_set_error(error, GPTOSS_ERR_IO, "%s:%s: response body cut short", url->host,
                                  url->port);
        goto done;
    }
    for (;;) {
        if (!read_line(r, line, sizeof line)) {
            st = gptoss_set_error(error, GPTOSS_ERR_IO, "%s:%s: bad chunk header", url->host,
                                  url->port);
            goto done;
        }
        char *end = NULL;
        unsigned long long size = strtoull(line, &end, 16);
        if (end == line) {
            st = gptoss_set_error(error, GPTOSS_ERR_IO, "%s:%s: bad chunk size '%s'", url->host,
                                  url->port, line);
            goto done;
        }
        if (size == 0) break;
        int rc = pass_body(r, (size_t)size, on_body, user);
        if (rc < 0) {
            st = gptoss_set_error(error, GPTOSS_ERR_IO, "%s:%s: chunk cut short", url->host,
                                  url->port);
            goto done;
        }
        if (rc > 0) goto done;
        if (!read_line(r, line, sizeof line)) {
            st = gptoss_set_error(error, GPTOSS_ERR_IO, "%s:%s: missing CRLF after a chunk",
                                  url->host, url->port);
            goto done;
        }
    }
done:
    free(r);
    close(fd);
    return st;
}
