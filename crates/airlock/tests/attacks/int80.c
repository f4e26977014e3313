/*
 * Enters the kernel through the i386 entry point (`int $0x80`) from a 64-bit process:
 * syscall 20 is getpid on i386. A filter that only checks syscall numbers would let the
 * i386 table through (its numbers mean other calls); airlock's filter must kill the process
 * with SIGSYS instead. Printing "survived" means the call was let through.
 */
#include <stdio.h>

int main(void) {
    long ret;
    __asm__ volatile("int $0x80" : "=a"(ret) : "a"(20L) : "memory", "cc", "r8", "r9", "r10", "r11");
    printf("survived ret=%ld\n", ret);
    return 0;
}
