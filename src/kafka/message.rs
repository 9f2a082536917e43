//! A consumed Kafka message detached from the consumer, bytes kept exactly as they came.

use rdkafka::message::{BorrowedMessage, Message, OwnedMessage};
use rdkafka_sys as rdsys;

use crate::headers::Header;

/// A consumed message, detached from the consumer, with its headers read byte-safely.
#[derive(Debug, Clone)]
pub struct Consumed {
    /// Key, value, coordinates and timestamp.
    pub message: OwnedMessage,
    /// Every header, in order, duplicates and absent values kept, names as bytes.
    pub headers: Vec<Header>,
}

impl Consumed {
    /// Copies what redrive needs out of the consumer's buffer.
    pub fn new(message: &BorrowedMessage<'_>) -> Consumed {
        let mut native: *mut rdsys::rd_kafka_headers_t = std::ptr::null_mut();
        // SAFETY: `message.ptr()` is a live message; librdkafka returns a header list
        // owned by the message (or an error and no list), valid while `message` is.
        let found = unsafe { rdsys::rd_kafka_message_headers(message.ptr(), &mut native) };
        let headers = if found == rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
            && !native.is_null()
        {
            // SAFETY: `native` is the message's live header list.
            unsafe { read_native_headers(native) }
        } else {
            Vec::new()
        };
        Consumed {
            message: message.detach(),
            headers,
        }
    }
}

/// Reads a native header list, names and values as raw bytes. (rdkafka's safe
/// accessors panic on a header name that is not UTF-8.) librdkafka hands names out as
/// C strings: a name with a NUL byte arrives cut at its first NUL.
///
/// # Safety
/// `native` must point to a live `rd_kafka_headers_t`.
pub(crate) unsafe fn read_native_headers(native: *const rdsys::rd_kafka_headers_t) -> Vec<Header> {
    let mut headers = Vec::new();
    for index in 0.. {
        let mut name: *const std::os::raw::c_char = std::ptr::null();
        let mut value: *const std::os::raw::c_void = std::ptr::null();
        let mut size = 0usize;
        let err = rdsys::rd_kafka_header_get_all(native, index, &mut name, &mut value, &mut size);
        if err != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || name.is_null() {
            break;
        }
        let name = std::ffi::CStr::from_ptr(name).to_bytes().to_vec();
        let value = (!value.is_null())
            .then(|| std::slice::from_raw_parts(value.cast::<u8>(), size).to_vec());
        headers.push(Header { name, value });
    }
    headers
}

impl Consumed {
    /// Bytes of key, value and headers: what the message weighs in a batch and a row.
    pub fn size(&self) -> usize {
        let message = &self.message;
        message.key().map_or(0, <[u8]>::len)
            + message.payload().map_or(0, <[u8]>::len)
            + self
                .headers
                .iter()
                .map(|h| h.name.len() + h.value.as_ref().map_or(0, Vec::len))
                .sum::<usize>()
    }

    /// A message of `size` value bytes on `test`/0, for unit tests.
    #[cfg(test)]
    pub(crate) fn for_test(size: usize) -> Consumed {
        let message = OwnedMessage::new(
            Some(vec![0; size]),
            None,
            "test".into(),
            rdkafka::message::Timestamp::NotAvailable,
            0,
            0,
            None,
        );
        Consumed {
            message,
            headers: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_names_that_are_not_utf8_are_kept_byte_for_byte() {
        let entries: [(&[u8], Option<&[u8]>); 3] = [
            (b"ok", Some(b"\x00\xff")),
            (b"bad\xff\xfe", Some(b"v")),
            (b"absent", None),
        ];
        // SAFETY: a header list created, read and destroyed here.
        unsafe {
            let native = rdsys::rd_kafka_headers_new(4);
            for (name, value) in entries {
                let (ptr, len) = match value {
                    Some(v) => (v.as_ptr().cast(), v.len() as isize),
                    None => (std::ptr::null(), 0),
                };
                rdsys::rd_kafka_header_add(
                    native,
                    name.as_ptr().cast(),
                    name.len() as isize,
                    ptr,
                    len,
                );
            }
            let headers = read_native_headers(native);
            rdsys::rd_kafka_headers_destroy(native);
            assert_eq!(headers.len(), 3);
            assert_eq!(headers[0], Header::new("ok", vec![0x00, 0xff]));
            assert_eq!(headers[1].name, b"bad\xff\xfe");
            assert_eq!(
                headers[2],
                Header {
                    name: "absent".into(),
                    value: None
                }
            );
        }
    }
}
