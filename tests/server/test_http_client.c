/*
 * test_http_client.c - the load generator's HTTP/1.1 client against hand-written server
 * bytes: URL parsing, Content-Length and chunked bodies split at awkward places (inside the
 * chunk-size line, inside CRLFs), read-until-close bodies, and clear errors for a truncated
 * response or a closed port. The expected bodies are written out by hand here.
 */
#include "test_support.h"

#include "server/http_client.h"

#include <arpa/inet.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* A one-shot server: accepts one connection, reads the request head, writes `pieces` with a
 * short pause between them (so the client sees them in separate reads), then closes. */
typedef struct fake_server {
    int listen_fd;
    int port;
    const char *const *pieces;
    char request[4096]; /* what the client sent */
    pthread_t thread;
} fake_server;

static void *serve_once(void *arg) {
    fake_server *s = arg;
    int fd = accept(s->listen_fd, NULL, NULL);
    if (fd < 0) return NULL;
    size_t got = 0;
    while (got + 1 < sizeof s->request) {
        ssize_t n = recv(fd, s->request + got, sizeof s->request - 1 - got, 0);
        if (n <= 0) break;
        got += (size_t)n;
        s->request[got] = '\0';
        char *end = strstr(s->request, "\r\n\r\n");
        if (end) {
            const char *cl = strstr(s->request, "Content-Length: ");
            size_t body = cl ? (size_t)atoi(cl + 16) : 0;
            if (got >= (size_t)(end + 4 - s->request) + body) break;
        }
    }
    for (size_t i = 0; s->pieces[i]; i++) {
        send(fd, s->pieces[i], strlen(s->pieces[i]), MSG_NOSIGNAL);
        usleep(20 * 1000);
    }
    close(fd);
    return NULL;
}

static void start_fake(fake_server *s, const char *const *pieces) {
    memset(s, 0, sizeof *s);
    s->pieces = pieces;
    s->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(s->listen_fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(s->listen_fd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t len = sizeof a;
    getsockname(s->listen_fd, (struct sockaddr *)&a, &len);
    s->port = ntohs(a.sin_port);
    assert_int_equal(listen(s->listen_fd, 4), 0);
    assert_int_equal(pthread_create(&s->thread, NULL, serve_once, s), 0);
}

static void stop_fake(fake_server *s) {
    pthread_join(s->thread, NULL);
    close(s->listen_fd);
}

typedef struct collected {
    char data[4096];
    size_t len;
    int calls;
} collected;

static int collect(void *user, const char *data, size_t len) {
    collected *c = user;
    if (c->len + len < sizeof c->data) memcpy(c->data + c->len, data, len), c->len += len;
    c->calls++;
    return 0;
}

static gptoss_status fetch(fake_server *s, int *status, collected *out, gptoss_error *err) {
    char url_text[64];
    snprintf(url_text, sizeof url_text, "http://127.0.0.1:%d/v1", s->port);
    gptoss_http_url url;
    assert_int_equal(gptoss_http_url_parse(url_text, &url, err), GPTOSS_OK);
    memset(out, 0, sizeof *out);
    return gptoss_http_request(&url, "POST", "/completions", "k3y", "{\"a\":1}", 7, 5000, status,
                               collect, out, err);
}

static void test_url_parse(void **state) {
    gptoss_http_url u;
    gptoss_error err = {0};
    assert_int_equal(gptoss_http_url_parse("http://localhost:8000/v1/", &u, &err), GPTOSS_OK);
    assert_string_equal(u.host, "localhost");
    assert_string_equal(u.port, "8000");
    assert_string_equal(u.path_prefix, "/v1");
    assert_int_equal(gptoss_http_url_parse("http://[::1]", &u, &err), GPTOSS_OK);
    assert_string_equal(u.host, "::1");
    assert_string_equal(u.port, "80");
    assert_string_equal(u.path_prefix, "");
    assert_int_equal(gptoss_http_url_parse("https://x", &u, &err), GPTOSS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "only http://"));
    assert_int_equal(gptoss_http_url_parse("http://x:99999", &u, &err),
                     GPTOSS_ERR_INVALID_ARGUMENT);
    assert_int_equal(gptoss_http_url_parse("http://:80", &u, &err), GPTOSS_ERR_INVALID_ARGUMENT);
}

static void test_chunked_split_everywhere(void **state) {
    /* Body "data: hello\n\ndata: [DONE]\n\n" in chunks of 13 and 14 bytes, cut mid-line. */
    static const char *const pieces[] = {
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chu",
        "nked\r\n\r\nd\r",
        "\ndata: hello\n",
        "\n\r\n0",
        "e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n",
        NULL};
    fake_server s;
    start_fake(&s, pieces);
    int status = 0;
    collected c;
    gptoss_error err = {0};
    assert_int_equal(fetch(&s, &status, &c, &err), GPTOSS_OK);
    stop_fake(&s);
    assert_int_equal(status, 200);
    c.data[c.len] = '\0';
    assert_string_equal(c.data, "data: hello\n\ndata: [DONE]\n\n");
    assert_true(c.calls >= 2); /* delivered as it arrived, not at the end */
    assert_non_null(strstr(s.request, "POST /v1/completions HTTP/1.1\r\n"));
    assert_non_null(strstr(s.request, "Authorization: Bearer k3y\r\n"));
    assert_non_null(strstr(s.request, "Content-Length: 7\r\n"));
    assert_non_null(strstr(s.request, "\r\n\r\n{\"a\":1}"));
}

static void test_content_length_and_close(void **state) {
    static const char *const with_length[] = {
        "HTTP/1.1 404 Not Found\r\nContent-Length: 5\r\n\r\nab", "cdeIGNORED", NULL};
    fake_server s;
    start_fake(&s, with_length);
    int status = 0;
    collected c;
    gptoss_error err = {0};
    assert_int_equal(fetch(&s, &status, &c, &err), GPTOSS_OK);
    stop_fake(&s);
    assert_int_equal(status, 404);
    assert_int_equal(c.len, 5);
    assert_memory_equal(c.data, "abcde", 5);

    static const char *const until_close[] = {"HTTP/1.0 200 OK\r\n\r\nfirst ", "second", NULL};
    start_fake(&s, until_close);
    assert_int_equal(fetch(&s, &status, &c, &err), GPTOSS_OK);
    stop_fake(&s);
    assert_int_equal(c.len, 12);
    assert_memory_equal(c.data, "first second", 12);
}

static void test_truncated_and_refused(void **state) {
    static const char *const cut[] = {"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\nonly this",
                                      NULL};
    fake_server s;
    start_fake(&s, cut);
    int status = 0;
    collected c;
    gptoss_error err = {0};
    assert_int_equal(fetch(&s, &status, &c, &err), GPTOSS_ERR_IO);
    stop_fake(&s);
    assert_non_null(strstr(err.message, "cut short"));

    static const char *const cut_chunk[] = {
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nshort", NULL};
    start_fake(&s, cut_chunk);
    assert_int_equal(fetch(&s, &status, &c, &err), GPTOSS_ERR_IO);
    stop_fake(&s);

    /* A port nobody listens on: bind one, note it, close it. */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    bind(fd, (struct sockaddr *)&a, sizeof a);
    socklen_t len = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &len);
    close(fd);
    char url_text[64];
    snprintf(url_text, sizeof url_text, "http://127.0.0.1:%d", ntohs(a.sin_port));
    gptoss_http_url url;
    assert_int_equal(gptoss_http_url_parse(url_text, &url, &err), GPTOSS_OK);
    assert_int_equal(
        gptoss_http_request(&url, "GET", "/health", NULL, NULL, 0, 2000, &status, NULL, NULL, &err),
        GPTOSS_ERR_IO);
    assert_non_null(strstr(err.message, "cannot connect"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_url_parse),
        cmocka_unit_test(test_chunked_split_everywhere),
        cmocka_unit_test(test_content_length_and_close),
        cmocka_unit_test(test_truncated_and_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
