# Installs the shared library, the public headers and an exported CMake
# package, so that `find_package(capalloc)` followed by
# `target_link_libraries(app capalloc::capalloc)` works from the prefix.
include(CMakePackageConfigHelpers)

install(TARGETS capalloc EXPORT capallocTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY include/capalloc DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT capallocTargets NAMESPACE capalloc::
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/capalloc)

configure_package_config_file(cmake/capallocConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/capallocConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/capalloc)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/capallocConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/capallocConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/capallocConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/capalloc)

# capalloc.pc, for builds that use pkg-config rather than CMake. Its prefix
# is found from the file's own location (${pcfiledir}).
file(RELATIVE_PATH CAPALLOC_PC_PREFIX_FROM_PCDIR
  "/prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/prefix")
configure_file(cmake/capalloc.pc.in ${CMAKE_CURRENT_BINARY_DIR}/capalloc.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/capalloc.pc
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
