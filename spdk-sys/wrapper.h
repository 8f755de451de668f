/* The SPDK headers talon's in-process target uses (spdk-sys `bindings` feature). */
#include <spdk/event.h>
#include <spdk/log.h>
#include <spdk/version.h>
