/* The pod sandbox's PID 1 for the test bed's real nodes (image fracgpu.local/pause, built by images.py).
 *
 * It holds the pod's namespaces open: it sleeps in pause() until SIGINT or SIGTERM, then exits 0. As PID 1 of
 * the pod's PID namespace it also reaps every orphan re-parented to it (SIGCHLD), so no zombie is left behind. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int sig)
{
    (void)sig;
    _exit(0);
}

static void on_child(int sig)
{
    int saved = errno;
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0)
        ;
    errno = saved;
}

static int handle(int sig, void (*handler)(int), int flags)
{
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = handler;
    action.sa_flags = flags;
    sigemptyset(&action.sa_mask);
    return sigaction(sig, &action, NULL);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "-v") == 0) {
        puts("fracgpu pause");
        return 0;
    }
    if (handle(SIGINT, on_stop, 0) != 0 || handle(SIGTERM, on_stop, 0) != 0 ||
        handle(SIGCHLD, on_child, SA_NOCLDSTOP | SA_RESTART) != 0) {
        perror("pause: sigaction");
        return 1;
    }
    for (;;)
        pause();
}
