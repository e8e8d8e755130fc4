/* capalloc/export.h: symbol visibility for the capalloc shared library.
 *
 * The library is built with hidden visibility; only declarations marked
 * CAPALLOC_API are exported. Consumers see the same header with the macro
 * expanding to a plain default-visibility attribute, which is harmless. */
#ifndef CAPALLOC_EXPORT_H_
#define CAPALLOC_EXPORT_H_

#if defined(_WIN32)
#if defined(CAPALLOC_BUILDING_LIBRARY)
#define CAPALLOC_API __declspec(dllexport)
#else
#define CAPALLOC_API __declspec(dllimport)
#endif
#else
#define CAPALLOC_API __attribute__((visibility("default")))
#endif

/* For definitions of an exported class's private parts (its Impl), which
 * would otherwise inherit the class's default visibility. */
#if defined(_WIN32)
#define CAPALLOC_INTERNAL
#else
#define CAPALLOC_INTERNAL __attribute__((visibility("hidden")))
#endif

#endif /* CAPALLOC_EXPORT_H_ */
