//! Socket addresses: IPv4, IPv6 and Unix, between the kernel's form
//! (`sockaddr_storage`) and the socket module's Python form.
//!
//! Parsing and printing follow the socket module exactly: host text through
//! `inet_pton` / `inet_ntop` (the C library's, as CPython's `socketmodule.c`
//! uses), Unix paths encoded and decoded with the filesystem encoding,
//! abstract names as bytes. Anything the module would resolve, convert or
//! reject in its own way (names, IDNA, scope ids in the text, str
//! subclasses, over-long paths) is not parsed here: the caller hands it to
//! the socket module.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyInt, PyString, PyTuple};

use crate::capi;
use crate::errors::{last_errno, os_error};
use crate::os::net::HostText;
/// A socket address as the kernel takes and gives it (the storage and its
/// system calls are in the os edge; the conversions are here).
pub(crate) use crate::os::net::SockAddr;

/// Where `sun_path` starts in a `sockaddr_un` (after the family).
const SUN_PATH_OFFSET: usize = std::mem::size_of::<libc::sa_family_t>();
/// The size of `sun_path`.
const SUN_PATH_LEN: usize = std::mem::size_of::<libc::sockaddr_un>() - SUN_PATH_OFFSET;

/// `a.b.c.d` for an IPv4 address in network order, into `out`; its length.
fn ipv4_text(octets: [u8; 4], out: &mut [u8; 16]) -> usize {
    let mut n = 0;
    for (i, octet) in octets.into_iter().enumerate() {
        if i > 0 {
            out[n] = b'.';
            n += 1;
        }
        if octet >= 100 {
            out[n] = b'0' + octet / 100;
            n += 1;
        }
        if octet >= 10 {
            out[n] = b'0' + octet / 10 % 10;
            n += 1;
        }
        out[n] = b'0' + octet % 10;
        n += 1;
    }
    n
}

thread_local! {
    /// The host text of the last IPv4 address made a Python object: the
    /// peers of a server, the server of a client, are mostly the same few
    /// addresses, and a str is immutable, so they can share one.
    static LAST_IPV4_HOST: std::cell::RefCell<Option<(u32, Py<PyString>)>> = const { std::cell::RefCell::new(None) };
}

/// The host text of an IPv4 address (network order) as a Python str.
fn ipv4_host(py: Python<'_>, addr: u32) -> Bound<'_, PyString> {
    LAST_IPV4_HOST.with(|last| {
        if let Some((a, host)) = last.borrow().as_ref() {
            if *a == addr {
                return host.bind(py).clone();
            }
        }
        let mut text = [0u8; 16];
        let n = ipv4_text(addr.to_ne_bytes(), &mut text);
        // Digits and dots only.
        let host = PyString::new(py, std::str::from_utf8(&text[..n]).unwrap_or_default());
        *last.borrow_mut() = Some((addr, host.clone().unbind()));
        host
    })
}

impl SockAddr {
    /// An IPv4 address and port.
    fn v4(addr: libc::in_addr, port: u16) -> Self {
        let mut a = SockAddr::empty();
        let sin = a.view_mut::<libc::sockaddr_in>();
        sin.sin_family = libc::AF_INET as libc::sa_family_t;
        sin.sin_port = port.to_be();
        sin.sin_addr = addr;
        a.set_len(std::mem::size_of::<libc::sockaddr_in>());
        a
    }

    /// An IPv6 address with its port, flow info and scope.
    fn v6(addr: libc::in6_addr, port: u16, flowinfo: u32, scope_id: u32) -> Self {
        let mut a = SockAddr::empty();
        let sin6 = a.view_mut::<libc::sockaddr_in6>();
        sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
        sin6.sin6_port = port.to_be();
        sin6.sin6_flowinfo = flowinfo.to_be();
        sin6.sin6_scope_id = scope_id;
        sin6.sin6_addr = addr;
        a.set_len(std::mem::size_of::<libc::sockaddr_in6>());
        a
    }

    /// `host` as an IP address literal of `family` (AF_INET, AF_INET6, or 0
    /// for either, IPv4 first), as `inet_pton` reads it, with the port and
    /// IPv6 details. None when `host` is not such a literal; a `%` zone is
    /// never taken (the socket module resolves it).
    pub(crate) fn ip(host: &str, family: i32, port: u16, flowinfo: u32, scope_id: u32) -> Option<Self> {
        if host.contains('%') {
            return None;
        }
        let text = HostText::new(host)?;
        if family == 0 || family == libc::AF_INET {
            if let Some(a) = text.ipv4() {
                return Some(SockAddr::v4(a, port));
            }
        }
        if family == 0 || family == libc::AF_INET6 {
            if let Some(a) = text.ipv6() {
                return Some(SockAddr::v6(a, port, flowinfo, scope_id));
            }
        }
        None
    }

    /// A Unix socket path as the socket module builds it from bytes: a path
    /// with a NUL after it, or a Linux abstract name (a leading NUL byte)
    /// taken as is. None for an empty or too long path.
    pub(crate) fn unix(path: &[u8]) -> Option<Self> {
        let abstract_name = path.first() == Some(&0);
        if path.is_empty()
            || (abstract_name && path.len() > SUN_PATH_LEN)
            || (!abstract_name && path.len() >= SUN_PATH_LEN)
        {
            return None;
        }
        let mut a = SockAddr::empty();
        let sun = a.view_mut::<libc::sockaddr_un>();
        sun.sun_family = libc::AF_UNIX as libc::sa_family_t;
        for (dst, src) in sun.sun_path.iter_mut().zip(path) {
            *dst = *src as libc::c_char;
        }
        // A path counts its terminating NUL (already there: zeroed storage).
        a.set_len(SUN_PATH_OFFSET + path.len() + usize::from(!abstract_name));
        Some(a)
    }

    /// The host of an IPv4 / IPv6 address as `inet_ntop` prints it, and the
    /// port. None for other families. (The tests' view; the code prints
    /// into a stack buffer with `with_ip_text`.)
    #[cfg(test)]
    pub(crate) fn ip_text(&self) -> Option<(String, u16)> {
        self.with_ip_text(|host, port| (host.to_owned(), port))
    }

    /// `f(host, port)` with the host printed by inet_ntop into a buffer on
    /// the stack (no allocation); None for a family without an IP address.
    fn with_ip_text<R>(&self, f: impl FnOnce(&str, u16) -> R) -> Option<R> {
        match self.family() {
            libc::AF_INET => {
                // What inet_ntop prints for IPv4, without its printf.
                let sin = self.view::<libc::sockaddr_in>();
                let mut text = [0u8; 16];
                let n = ipv4_text(sin.sin_addr.s_addr.to_ne_bytes(), &mut text);
                // Digits and dots only.
                Some(f(std::str::from_utf8(&text[..n]).unwrap_or_default(), u16::from_be(sin.sin_port)))
            }
            libc::AF_INET6 => {
                let sin6 = self.view::<libc::sockaddr_in6>();
                crate::os::net::with_ipv6_text(&sin6.sin6_addr, |host| f(host, u16::from_be(sin6.sin6_port)))
            }
            _ => None,
        }
    }

    /// The address as the socket module gives it (`socket.recvfrom`,
    /// `getpeername`, getaddrinfo results): `(host, port)` for IPv4,
    /// `(host, port, flowinfo, scope_id)` for IPv6, a str path or bytes
    /// abstract name for Unix. None for an empty address (an unnamed Unix
    /// sender) and for other families.
    pub(crate) fn python_form(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        if self.len() == 0 {
            return Ok(py.None());
        }
        match self.family() {
            libc::AF_INET => {
                let host = ipv4_host(py, self.view::<libc::sockaddr_in>().sin_addr.s_addr);
                Ok(self.ip_python_form(py, host.into_any())?.into_any().unbind())
            }
            libc::AF_INET6 => {
                let Some(host) = self.with_ip_text(|host, _| PyString::new(py, host)) else {
                    return Err(os_error(last_errno()));
                };
                Ok(self.ip_python_form(py, host.into_any())?.into_any().unbind())
            }
            libc::AF_UNIX => self.unix_to_python(py),
            _ => Ok(py.None()),
        }
    }

    /// An IP address as the socket module gives it, with `host` (the
    /// address's text, already a Python object) for its host.
    pub(crate) fn ip_python_form<'py>(
        &self,
        py: Python<'py>,
        host: Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        if self.family() == libc::AF_INET {
            let port = u16::from_be(self.view::<libc::sockaddr_in>().sin_port).into_pyobject(py)?.into_any();
            PyTuple::new(py, [host, port])
        } else {
            let sin6 = self.view::<libc::sockaddr_in6>();
            let port = u16::from_be(sin6.sin6_port).into_pyobject(py)?.into_any();
            let flowinfo = u32::from_be(sin6.sin6_flowinfo).into_pyobject(py)?.into_any();
            let scope_id = sin6.sin6_scope_id.into_pyobject(py)?.into_any();
            PyTuple::new(py, [host, port, flowinfo, scope_id])
        }
    }

    /// A Unix address as CPython's `makesockaddr` gives it on Linux: an
    /// abstract name (leading NUL) as bytes of the length the kernel
    /// reported, a path as a str decoded with the filesystem encoding up to
    /// its NUL.
    fn unix_to_python(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let n = (self.len() as usize).saturating_sub(SUN_PATH_OFFSET).min(SUN_PATH_LEN);
        let path = self.sun_path();
        if n > 0 && path[0] == 0 {
            return Ok(PyBytes::new(py, &path[..n]).into_any().unbind());
        }
        let end = path[..n].iter().position(|&b| b == 0).unwrap_or(n);
        Ok(capi::net::fs_decode(py, &path[..end])?.into_any().unbind())
    }
}

/// A Python address for a socket of `family` parsed as the socket module
/// would, when that needs no resolver and no conversion: an exact tuple of
/// an exact ASCII str host literal and exact ints in range for IP (`(host,
/// port)`, or up to `(host, port, flowinfo, scope_id)` for IPv6), an exact
/// str or bytes path for Unix. None for everything else, which the socket
/// module then accepts, resolves or rejects itself.
pub(crate) fn from_python(addr: &Bound<'_, PyAny>, family: i32) -> Option<SockAddr> {
    if family == libc::AF_UNIX {
        return unix_from_python(addr);
    }
    let t = addr.cast_exact::<PyTuple>().ok()?;
    let host = t.get_item(0).ok()?;
    let host = host.cast_exact::<PyString>().ok()?.to_str().ok()?;
    if !host.is_ascii() {
        return None; // IDNA
    }
    match family {
        libc::AF_INET if t.len() == 2 => {
            let port = small_int(&t.get_item(1).ok()?, 0, 0xffff)?;
            SockAddr::ip(host, libc::AF_INET, port as u16, 0, 0)
        }
        libc::AF_INET6 if (2..=4).contains(&t.len()) => {
            let port = small_int(&t.get_item(1).ok()?, 0, 0xffff)?;
            let flowinfo = if t.len() > 2 { small_int(&t.get_item(2).ok()?, 0, 0xfffff)? } else { 0 };
            let scope_id = if t.len() > 3 { small_int(&t.get_item(3).ok()?, 0, u32::MAX as i64)? } else { 0 };
            SockAddr::ip(host, libc::AF_INET6, port as u16, flowinfo as u32, scope_id as u32)
        }
        _ => None,
    }
}

/// A Unix path from an exact str (encoded with the filesystem encoding) or
/// exact bytes; None for other types and for a str the encoding refuses.
fn unix_from_python(addr: &Bound<'_, PyAny>) -> Option<SockAddr> {
    if let Ok(b) = addr.cast_exact::<PyBytes>() {
        return SockAddr::unix(b.as_bytes());
    }
    let s = addr.cast_exact::<PyString>().ok()?;
    // (An encoding error is dropped: the socket module raises its own.)
    let encoded = capi::net::fs_encode(s).ok()?;
    SockAddr::unix(encoded.as_bytes())
}

/// An exact int in `lo..=hi`, or None (the socket module then decides).
fn small_int(obj: &Bound<'_, PyAny>, lo: i64, hi: i64) -> Option<i64> {
    if !obj.is_exact_instance_of::<PyInt>() {
        return None;
    }
    let v: i64 = obj.extract().ok()?;
    (lo..=hi).contains(&v).then_some(v)
}

/// `host` and `port` as an address, if `host` is an IP literal written the
/// way `inet_ntop` prints it (the form getaddrinfo reports back for a
/// numeric host).
pub(crate) fn canonical_ip(host: &str, port: u16) -> Option<SockAddr> {
    let a = SockAddr::ip(host, 0, port, 0, 0)?;
    if a.family() == libc::AF_INET {
        // inet_pton takes an IPv4 address only as inet_ntop prints it (four
        // decimal numbers up to 255, no leading zeros): printing it back,
        // which costs more than the rest of a getaddrinfo answer, would
        // only give the same text.
        return Some(a);
    }
    a.with_ip_text(|text, _| text == host)?.then_some(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_literals() {
        let a = SockAddr::ip("127.0.0.1", 0, 8080, 0, 0).expect("literal");
        assert_eq!(a.family(), libc::AF_INET);
        assert_eq!(a.ip_text(), Some(("127.0.0.1".to_string(), 8080)));
        assert!(SockAddr::ip("127.1", 0, 0, 0, 0).is_none(), "inet_pton takes dotted quads only");
        assert!(SockAddr::ip("localhost", 0, 0, 0, 0).is_none());
        assert!(SockAddr::ip("1.2.3.4", libc::AF_INET6, 0, 0, 0).is_none());
    }

    #[test]
    fn ipv4_text_is_inet_ntops() {
        for addr in ["0.0.0.0", "127.0.0.1", "10.20.30.40", "255.255.255.255", "1.100.9.199", "192.168.0.10"] {
            let a = SockAddr::ip(addr, 0, 1, 0, 0).expect("literal");
            assert_eq!(a.ip_text(), Some((addr.to_string(), 1)));
        }
    }

    #[test]
    fn ipv6_literals() {
        let a = SockAddr::ip("::1", 0, 1, 2, 3).expect("literal");
        assert_eq!(a.family(), libc::AF_INET6);
        assert_eq!(a.ip_text(), Some(("::1".to_string(), 1)));
        assert!(SockAddr::ip("fe80::1%lo", 0, 0, 0, 0).is_none(), "zones go to the socket module");
        assert!(SockAddr::ip("::1", libc::AF_INET, 0, 0, 0).is_none());
    }

    #[test]
    fn canonical_forms() {
        let family = |host| canonical_ip(host, 80).map(|a| a.family());
        assert_eq!(family("10.0.0.1"), Some(libc::AF_INET));
        assert_eq!(family("2001:db8::1"), Some(libc::AF_INET6));
        assert_eq!(family("2001:DB8::1"), None, "inet_ntop prints lower case");
        assert_eq!(family("010.0.0.1"), None);
        for bad in ["1.2.3", "1.2.3.4.5", "256.0.0.1", "1.2.3.04", " 1.2.3.4", "1.2.3.4 ", "0x1.2.3.4", "1..2.3"] {
            assert_eq!(family(bad), None, "{bad}");
        }
        // Every IPv4 address inet_pton takes is already in inet_ntop's form.
        for host in ["0.0.0.0", "255.255.255.255", "10.20.30.40", "1.0.10.100"] {
            let a = canonical_ip(host, 1).expect(host);
            assert_eq!(a.ip_text(), Some((host.to_string(), 1)));
        }
        assert_eq!(family("0:0:0:0:0:0:0:1"), None);
        assert_eq!(canonical_ip("::1", 8080).and_then(|a| a.ip_text()), Some(("::1".to_string(), 8080)));
    }

    #[test]
    fn unix_paths() {
        let a = SockAddr::unix(b"/tmp/x").expect("path");
        assert_eq!(a.family(), libc::AF_UNIX);
        assert_eq!(a.len() as usize, SUN_PATH_OFFSET + 7, "a path counts its NUL");
        let b = SockAddr::unix(b"\0name").expect("abstract");
        assert_eq!(b.len() as usize, SUN_PATH_OFFSET + 5, "an abstract name does not");
        assert!(SockAddr::unix(b"").is_none());
        assert!(SockAddr::unix(&[b'a'; SUN_PATH_LEN]).is_none());
        assert!(SockAddr::unix(&[0; SUN_PATH_LEN]).is_some());
    }
}
