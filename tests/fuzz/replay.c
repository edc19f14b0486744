/* replay.c: runs a fuzz target over corpus files without libFuzzer (a regression test). */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int
replay_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    uint8_t *buf;
    long n;

    if (f == NULL) {
        perror(path);
        return -1;
    }
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = malloc(n > 0 ? (size_t) n : 1);
    if (buf == NULL || fread(buf, 1, (size_t) n, f) != (size_t) n) {
        fclose(f);
        free(buf);
        return -1;
    }
    fclose(f);
    LLVMFuzzerTestOneInput(buf, (size_t) n);
    free(buf);
    return 0;
}

int
main(int argc, char **argv)
{
    int i, count = 0;
    char path[4096];
    struct dirent *e;
    struct stat st;
    DIR *d;

    for (i = 1; i < argc; i++) {
        if (stat(argv[i], &st) == 0 && S_ISDIR(st.st_mode)) {
            d = opendir(argv[i]);
            while (d && (e = readdir(d)) != NULL) {
                if (e->d_name[0] == '.') {
                    continue;
                }
                snprintf(path, sizeof(path), "%s/%s", argv[i], e->d_name);
                if (replay_file(path) != 0) {
                    return 1;
                }
                count++;
            }
            if (d) {
                closedir(d);
            }
        } else {
            if (replay_file(argv[i]) != 0) {
                return 1;
            }
            count++;
        }
    }
    printf("replayed %d inputs\n", count);
    return 0;
}
