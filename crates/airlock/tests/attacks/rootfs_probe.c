/*
 * A statically linked probe for a --rootfs made of nothing but this program: reports
 * which host paths it can see, one `path=yes|no` line each, then `probe done`.
 */
#include <stdio.h>
#include <unistd.h>

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        printf("%s=%s\n", argv[i], access(argv[i], F_OK) == 0 ? "yes" : "no");
    printf("probe done\n");
    return 0;
}
