/*
 * test_options.c - the table-driven option parser of the CLI (src/cli/options.c): bounds,
 * unknown options, missing values, enum choices, -h/--help, the shared model and backend group
 * and the help generated from the table. The parser and its helpers are compiled in directly
 * (they are part of the binary, not of the library).
 */
#include "../../src/cli/common.c"
#include "../../src/cli/options.c"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int failures;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);                        \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

/* stderr of the calls since the last capture_begin, read back by capture_end. */
static FILE *captured;
static int saved_stderr = -1;

static void capture_begin(void) {
    fflush(stderr);
    captured = tmpfile();
    saved_stderr = dup(STDERR_FILENO);
    dup2(fileno(captured), STDERR_FILENO);
}

static const char *capture_end(void) {
    static char text[1024];
    fflush(stderr);
    dup2(saved_stderr, STDERR_FILENO);
    close(saved_stderr);
    rewind(captured);
    size_t n = fread(text, 1, sizeof text - 1, captured);
    text[n] = '\0';
    fclose(captured);
    return text;
}

static int64_t count;
static double ratio;
static const char *name;
static bool verbose;
static int color;
static const char *const colors[] = {"red", "green", "blue", NULL};

static const cli_option table[] = {
    {.name = "count",
     .short_name = 'c',
     .kind = CLI_INT,
     .target = &count,
     .value = "N",
     .lo = 1,
     .hi = 10,
     .help = "how many"},
    {.name = "ratio",
     .kind = CLI_DOUBLE,
     .target = &ratio,
     .value = "R",
     .dlo = 0,
     .dhi = 1,
     .lo_open = true,
     .help = "a share\nof the whole"},
    {.name = "name", .kind = CLI_STRING, .target = &name, .value = "S", .help = "a name"},
    {.name = "verbose", .short_name = 'v', .kind = CLI_FLAG, .target = &verbose, .help = "talk"},
    {.name = "color", .kind = CLI_ENUM, .target = &color, .choices = colors, .help = "hue"},
    {.name = "file",
     .kind = CLI_STRING,
     .target = &name,
     .value = "F",
     .needs = "a path",
     .help = "a file"},
    {.name = "knob", .kind = CLI_INT, .target = &count, .lo = 0, .hi = 3, .hidden = true},
};
static const cli_option_group group = {table, sizeof table / sizeof table[0], NULL};

/* Parses the NULL-terminated arguments after a command name; returns the exit status. */
static int parse(bool *help, ...) {
    char *argv[16] = {"test"};
    int argc = 1;
    va_list ap;
    va_start(ap, help);
    for (char *a; argc < 15 && (a = va_arg(ap, char *));)
        argv[argc++] = a;
    va_end(ap);
    count = 5, ratio = 0.5, name = NULL, verbose = false, color = -1;
    return cli_parse_options("test", argc, argv, &group, 1, help);
}

int main(void) {
    bool help = false;
    CHECK(parse(&help, "-c", "3", "--ratio", "1", "--name", "x", "-v", "--color", "blue", NULL) ==
          0);
    CHECK(count == 3 && ratio == 1 && name && !strcmp(name, "x") && verbose && color == 2 && !help);
    CHECK(parse(&help, "--count", "1", NULL) == 0 && count == 1);
    CHECK(parse(&help, "--count", "10", NULL) == 0 && count == 10);
    /* Out of bounds, not a number, trailing garbage: usage errors (2), the target untouched. */
    CHECK(parse(&help, "--count", "0", NULL) == 2 && count == 5);
    CHECK(parse(&help, "-c", "11", NULL) == 2 && count == 5);
    CHECK(parse(&help, "-c", "3x", NULL) == 2 && count == 5);
    CHECK(parse(&help, "-c", "", NULL) == 2);
    CHECK(parse(&help, "--ratio", "0", NULL) == 2 && ratio == 0.5); /* (0, 1] */
    CHECK(parse(&help, "--ratio", "1.01", NULL) == 2);
    CHECK(parse(&help, "--ratio", "nan", NULL) == 2);
    CHECK(parse(&help, "--ratio", "", NULL) == 2);
    CHECK(parse(&help, "--ratio", "1e-9", NULL) == 0 && ratio == 1e-9);
    CHECK(parse(&help, "--color", "Red", NULL) == 2 && color == -1);
    /* Unknown options and missing values. */
    CHECK(parse(&help, "--bogus", NULL) == 2);
    CHECK(parse(&help, "-x", NULL) == 2);
    CHECK(parse(&help, "positional", NULL) == 2);
    CHECK(parse(&help, "--", NULL) == 2);
    CHECK(parse(&help, "-cv", NULL) == 2);
    CHECK(parse(&help, "--count", NULL) == 2 && count == 5);
    CHECK(parse(&help, "-v", "--name", NULL) == 2 && name == NULL);
    /* Hidden options are accepted like the others. */
    CHECK(parse(&help, "--knob", "3", NULL) == 0 && count == 3);
    CHECK(parse(&help, "--knob", "4", NULL) == 2);

    /* The messages name the option and what was wrong. */
    capture_begin();
    parse(&help, "--count", "11", NULL);
    const char *msg = capture_end();
    CHECK(strstr(msg, "gptoss test: --count needs an integer in [1, 10], not '11'"));
    capture_begin();
    parse(&help, "--ratio", "0", NULL);
    msg = capture_end();
    CHECK(strstr(msg, "--ratio needs a number in (0, 1], not '0'"));
    capture_begin();
    parse(&help, "--color", "Red", NULL);
    msg = capture_end();
    CHECK(strstr(msg, "--color must be red, green or blue, not 'Red'"));
    capture_begin();
    parse(&help, "--bogus", NULL);
    msg = capture_end();
    CHECK(strstr(msg, "unknown option '--bogus'") && strstr(msg, "gptoss test --help"));
    capture_begin();
    parse(&help, "-c", NULL);
    msg = capture_end();
    CHECK(strstr(msg, "-c needs a value"));
    capture_begin();
    parse(&help, "--file", NULL);
    msg = capture_end();
    CHECK(strstr(msg, "--file needs a path"));

    /* --help stops parsing: what follows it is not checked. */
    CHECK(parse(&help, "-v", "--help", "--bogus", NULL) == 0 && help);
    CHECK(parse(&help, "-h", NULL) == 0 && help);

    /* The help, generated from the table. */
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    const cli_option_group with_heading[] = {{table, 2, NULL}, {table + 2, 5, "other:\n"}};
    cli_print_options(out, with_heading, 2, 16);
    fclose(out);
    const char *want = "  -c, --count N how many\n"
                       "  --ratio R     a share\n"
                       "                of the whole\n"
                       "other:\n"
                       "  --name S      a name\n"
                       "  -v, --verbose talk\n"
                       "  --color red|green|blue\n"
                       "                hue\n"
                       "  --file F      a file\n";
    CHECK(text && !strcmp(text, want));
    if (text && strcmp(text, want)) fprintf(stderr, "help:\n%s", text);
    free(text);

    /* The shared model and backend group. */
    cli_model_options mo = cli_model_options_default();
    cli_option shared[CLI_MODEL_N_OPTIONS];
    cli_model_option_table(&mo, shared);
    cli_option_group g = {shared, CLI_MODEL_N_OPTIONS, NULL};
    CHECK(!mo.batch_invariant);
    char *args[] = {"x",    "-m",
                    "dir",  "--backend",
                    "cpu",  "-t",
                    "3",    "--device",
                    "2",    "--fp8-layers",
                    "none", "--kv-cache-dtype",
                    "fp8",  "--batch-invariant"};
    CHECK(cli_parse_options("x", 14, args, &g, 1, &help) == 0 && !help);
    CHECK(mo.model_dir && !strcmp(mo.model_dir, "dir") && mo.backend == 0 && mo.threads == 3 &&
          mo.device == 2 && mo.fp8_layers == 0 && mo.kv_cache_dtype == GPTOSS_KV_CACHE_FP8 &&
          mo.batch_invariant);
    gptoss_backend_options bo = gptoss_backend_options_default();
    CHECK(!bo.batch_invariant);
    /* the CPU backend takes --batch-invariant (it is batch-invariant already) */
    CHECK(cli_model_options_apply("x", &mo, &bo) == 0);
    CHECK(bo.kind == GPTOSS_BACKEND_CPU && bo.n_threads == 3 && bo.device == 2 &&
          bo.kv_cache_dtype == GPTOSS_KV_CACHE_FP8 && bo.batch_invariant);
    char *bad_threads[] = {"x", "-t", "0"};
    CHECK(cli_parse_options("x", 3, bad_threads, &g, 1, &help) == 2);
    char *bad_device[] = {"x", "--device", "65"};
    CHECK(cli_parse_options("x", 3, bad_device, &g, 1, &help) == 2);
    CHECK(bo.tensor_parallel_size == 1); /* not given: one GPU */
    /* tensor parallelism: parsed, bounded, and refused on the CPU backend */
    char *tp_cpu[] = {"x", "--backend", "cpu", "--tensor-parallel-size", "2"};
    CHECK(cli_parse_options("x", 5, tp_cpu, &g, 1, &help) == 0 && mo.tensor_parallel == 2);
    CHECK(cli_model_options_apply("x", &mo, &bo) == 2);
    char *tp_three[] = {"x", "--tensor-parallel-size", "3"};
    mo.backend = 1;
    CHECK(cli_parse_options("x", 3, tp_three, &g, 1, &help) == 0 && mo.tensor_parallel == 3);
    CHECK(cli_model_options_apply("x", &mo, &bo) == 2); /* 1, 2, 4 or 8 only */
    char *tp_big[] = {"x", "--tensor-parallel-size", "16"};
    CHECK(cli_parse_options("x", 3, tp_big, &g, 1, &help) == 2);
    mo.tensor_parallel = 0;
    mo.backend = 0;
    char *bad_backend[] = {"x", "--backend", "tpu"};
    CHECK(cli_parse_options("x", 3, bad_backend, &g, 1, &help) == 2);
    char *bad_fp8[] = {"x", "--fp8-layers", "qkv,"};
    CHECK(cli_parse_options("x", 3, bad_fp8, &g, 1, &help) == 2);
    char *fp8_on_cpu[] = {"x", "--backend", "cpu", "--fp8-layers", "qkv"};
    CHECK(cli_parse_options("x", 5, fp8_on_cpu, &g, 1, &help) == 0);
    CHECK(cli_model_options_apply("x", &mo, &bo) == 2); /* FP8 layers are a CUDA option */

    /* A bare argument: pointed at -m where the command takes a model. */
    char *positional[] = {"x", "some/dir"};
    capture_begin();
    CHECK(cli_parse_options("x", 2, positional, &g, 1, &help) == 2);
    const char *said = capture_end();
    CHECK(strstr(said, "unexpected argument 'some/dir' (to use it as the model: -m some/dir)"));
    capture_begin();
    CHECK(cli_parse_options("test", 2, positional, &group, 1, &help) == 2);
    said = capture_end();
    CHECK(strstr(said, "unexpected argument 'some/dir'") && !strstr(said, "-m some/dir"));

    /* A CUDA backend that cannot run: the probe's reason and the way to the CPU, whatever
     * this build holds; the default backend and --backend cuda are told apart. */
    gptoss_error probe = {.status = GPTOSS_ERR_BACKEND};
    snprintf(probe.message, sizeof probe.message,
             "CUDA: no usable GPU (no CUDA-capable device is detected)");
    capture_begin();
    CHECK(cli_device_unusable("serve", false, &probe) == 1);
    said = capture_end();
    CHECK(strstr(said, "gptoss serve: error: CUDA: no usable GPU (no CUDA-capable device is "
                       "detected)\n") &&
          strstr(said, "runs on the GPU (the CUDA backend) unless told otherwise") &&
          strstr(said, "add --backend cpu"));
    capture_begin();
    CHECK(cli_device_unusable("chat", true, &probe) == 1);
    said = capture_end();
    CHECK(strstr(said, "--backend cuda needs a CUDA build and a GPU") &&
          strstr(said, "add --backend cpu") && !strstr(said, "unless told otherwise"));
    /* In a build without CUDA, --backend cuda stops at apply, before any model. */
    if (!gptoss_has_cuda()) {
        char *cuda[] = {"x", "--backend", "cuda"};
        mo = cli_model_options_default();
        CHECK(cli_parse_options("x", 3, cuda, &g, 1, &help) == 0);
        capture_begin();
        CHECK(cli_model_options_apply("x", &mo, &bo) == 1);
        said = capture_end();
        CHECK(strstr(said, "built without CUDA") && strstr(said, "add --backend cpu"));
    }

    if (failures) fprintf(stderr, "%d failures\n", failures);
    return failures ? 1 : 0;
}
